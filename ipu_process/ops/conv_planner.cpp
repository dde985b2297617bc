// Convolution planner: one convolution's dimensions and output shapes, checked, and for each pass
// the blocking over tiles that is fastest within the available memory proportion.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/conv_internal.hpp"

namespace ipupod::ipu::ops {
namespace conv_impl {

std::string shape_str(const std::vector<std::size_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

void expect(bool ok, const std::string& name, const std::string& what) {
  if (!ok) throw std::invalid_argument(name + ": " + what);
}

Dims make_dims(const std::vector<std::size_t>& x, const std::vector<std::size_t>& wt,
               const ConvParams& p, const std::string& name) {
  expect(x.size() == 4, name, "input must be [n, channels, height, width], got " + shape_str(x));
  expect(wt.size() == 4, name,
         "weight must be [out_channels, in_channels/groups, kh, kw], got " + shape_str(wt));
  expect(
      p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1,
      name, "groups, strides and dilations must be at least 1");
  expect(wt[2] >= 1 && wt[3] >= 1, name, "kernel " + shape_str(wt) + " is empty");
  expect(x[1] % p.groups == 0 && wt[0] % p.groups == 0, name,
         "in_channels " + std::to_string(x[1]) + " and out_channels " + std::to_string(wt[0]) +
             " must be divisible by groups " + std::to_string(p.groups));
  expect(wt[1] * p.groups == x[1], name,
         "weight " + shape_str(wt) + " expects " + std::to_string(wt[1] * p.groups) +
             " input channels with groups " + std::to_string(p.groups) + ", input " + shape_str(x) +
             " has " + std::to_string(x[1]));
  Dims d{};
  d.p = p;
  d.n = x[0], d.ci = x[1], d.h = x[2], d.w = x[3];
  d.co = wt[0], d.kh = wt[2], d.kw = wt[3];
  d.groups = p.groups, d.cig = d.ci / p.groups, d.cog = d.co / p.groups;
  d.taps = d.kh * d.kw;
  d.oh = conv_output_size(d.h, p.pad_top + p.pad_bottom, d.kh, p.dilation_h, p.stride_h);
  d.ow = conv_output_size(d.w, p.pad_left + p.pad_right, d.kw, p.dilation_w, p.stride_w);
  expect(d.oh > 0 && d.ow > 0, name,
         "kernel " + shape_str(wt) + " with dilation " + std::to_string(p.dilation_h) + "x" +
             std::to_string(p.dilation_w) + " does not fit input " + shape_str(x) + " padded by " +
             std::to_string(p.pad_top) + "," + std::to_string(p.pad_bottom) + "," +
             std::to_string(p.pad_left) + "," + std::to_string(p.pad_right) +
             "; use a smaller kernel or more padding");
  expect(d.n > 0 && d.ci > 0 && d.co > 0, name,
         "empty batch or channels: input " + shape_str(x) + ", weight " + shape_str(wt));
  return d;
}

namespace {

// Distinct block sizes ceil(n / k) for k = 1..n, largest first.
std::vector<std::size_t> block_sizes(std::size_t n) {
  std::vector<std::size_t> out;
  for (std::size_t k = 1; k <= n; ++k) {
    const std::size_t b = ceil_div(n, k);
    if (out.empty() || out.back() != b) out.push_back(b);
  }
  return out;
}

struct Estimate {
  double bytes, cycles;
  double out = 0;  // the block's output bytes (moved onto the output's own mapping if remapped)
};

double exchange_cycles(const ArchPreset& arch, double bytes) {
  return static_cast<double>(arch.exchange_latency_cycles) +
         bytes / arch.exchange_bytes_per_cycle_per_tile;
}

// Tries every batch x channel x row blocking that fits the IPU's tiles and keeps the fastest
// whose busiest tile stays within the available memory proportion (or, if none does, the
// smallest, which the engine will then report as out of memory). With `output_blocks`, the
// blocks are of the pass's output: a blocking whose blocks are not runs of it also pays for
// the output's move onto its own mapping (see ConvPlan::remap).
template <class F>
ConvPlan search_plan(const ArchPreset& arch, double proportion, std::size_t batch,
                     std::size_t channels, std::size_t rows, bool output_blocks, F&& estimate) {
  const double budget = proportion * static_cast<double>(arch.bytes_per_tile);
  ConvPlan best;
  double best_cycles = std::numeric_limits<double>::infinity();
  double best_bytes = std::numeric_limits<double>::infinity();
  bool have = false;
  for (std::size_t bn : block_sizes(batch)) {
    const std::size_t nbb = ceil_div(batch, bn);
    if (nbb > arch.tiles) continue;
    for (std::size_t bc : block_sizes(channels)) {
      const std::size_t ncb = ceil_div(channels, bc);
      if (nbb * ncb > arch.tiles) continue;
      for (std::size_t br : block_sizes(rows)) {
        const std::size_t nrb = ceil_div(rows, br);
        if (nbb * ncb * nrb > arch.tiles) continue;
        Estimate e = estimate(bn, bc, br, nbb * nrb);
        const bool remap = output_blocks && !block_is_one_run(bn, bc, br, channels, rows);
        if (remap) {
          e.bytes += e.out;
          e.cycles += exchange_cycles(arch, e.out);
        }
        const bool fits = e.bytes <= budget, best_fits = best_bytes <= budget;
        const bool better = !have || (fits && !best_fits) ||
                            (fits && best_fits &&
                             (e.cycles < best_cycles ||
                              (e.cycles == best_cycles && nbb * ncb * nrb < best.tiles()))) ||
                            (!fits && !best_fits && e.bytes < best_bytes);
        if (!better) continue;
        have = true;
        best = {bn,
                bc,
                br,
                nbb,
                ncb,
                nrb,
                static_cast<std::size_t>(e.bytes),
                static_cast<std::uint64_t>(e.cycles),
                fits,
                remap};
        best_cycles = e.cycles;
        best_bytes = e.bytes;
      }
    }
  }
  return best;
}

// The busiest worker's cycles for a tile's block of `items` planes x `rows` rows, `row_macs`
// multiply-accumulates per plane row: the vertices for_each_work_split makes, each costed as
// the engine costs it (mac_cycles) and given to the least-loaded worker, as the engine does.
double block_compute_cycles(const ArchPreset& arch, const Dims& d, std::size_t items,
                            std::size_t rows, double row_macs, const AmpShape& shape) {
  std::vector<std::uint64_t> loads(arch.workers_per_tile, 0);
  for_each_work_split(items, rows, arch.workers_per_tile,
                      [&](std::size_t i0, std::size_t i1, std::size_t q0, std::size_t q1) {
                        const double macs = static_cast<double>((i1 - i0) * (q1 - q0)) * row_macs;
                        *std::min_element(loads.begin(), loads.end()) +=
                            mac_cycles(arch, macs, d.dtype, shape);
                      });
  return static_cast<double>(*std::max_element(loads.begin(), loads.end()));
}

}  // namespace

ConvPlan plan_forward(const ArchPreset& arch, double proportion, const Dims& d) {
  return search_plan(
      arch, proportion, d.n, d.co, d.oh, true,
      [&](double bn, std::size_t bc, std::size_t br, auto) {
        const double hr = static_cast<double>(
            std::min(d.h, (br - 1) * d.p.stride_h + (d.kh - 1) * d.p.dilation_h + 1));
        const double in = 4.0 * bn * static_cast<double>(d.input_channels_bound(bc)) * hr * d.w;
        const double wt = 4.0 * static_cast<double>(bc * d.cig * d.taps);
        const double out = 4.0 * bn * static_cast<double>(bc * br * d.ow);
        const double compute =
            block_compute_cycles(arch, d, static_cast<std::size_t>(bn) * bc, br,
                                 static_cast<double>(d.ow * d.cig * d.taps),
                                 {double(d.cig), double(d.cog), d.half_partials});
        return Estimate{in + wt + out, compute + exchange_cycles(arch, in + wt), out};
      });
}

ConvPlan plan_grad_input(const ArchPreset& arch, double proportion, const Dims& d) {
  return search_plan(
      arch, proportion, d.n, d.ci, d.h, true, [&](double bn, std::size_t bc, std::size_t br, auto) {
        const double oyr = static_cast<double>(
            std::min(d.oh, (br + (d.kh - 1) * d.p.dilation_h) / d.p.stride_h + 1));
        const double in = 4.0 * bn * static_cast<double>(d.output_channels_bound(bc)) * oyr * d.ow;
        const double wt = 4.0 * static_cast<double>(bc * d.cog * d.taps);
        const double out = 4.0 * bn * static_cast<double>(bc * br * d.w);
        const double compute =
            block_compute_cycles(arch, d, static_cast<std::size_t>(bn) * bc, br,
                                 static_cast<double>(d.w * d.cog * d.taps) /
                                     static_cast<double>(d.p.stride_h * d.p.stride_w),
                                 {double(d.cog), double(d.cig), d.half_partials});
        return Estimate{in + wt + out, compute + exchange_cycles(arch, in + wt), out};
      });
}

// Blocks over output channels; batch and output rows are the reduction, split into parts.
ConvPlan plan_grad_weight(const ArchPreset& arch, double proportion, const Dims& d) {
  const std::size_t workers = arch.workers_per_tile;
  return search_plan(
      arch, proportion, d.n, d.co, d.oh, false,
      [&](double bn, std::size_t bc, std::size_t br, std::size_t parts) {
        const double hr = static_cast<double>(
            std::min(d.h, (br - 1) * d.p.stride_h + (d.kh - 1) * d.p.dilation_h + 1));
        const double in = 4.0 * bn * static_cast<double>(d.input_channels_bound(bc)) * hr * d.w;
        const double dy = 4.0 * bn * static_cast<double>(bc * br * d.ow);
        const double partial = 4.0 * static_cast<double>(bc * d.cig * d.taps);
        // (output channel, input channel) pairs shared out between the workers, as the
        // lowering does, each summing over the block's samples and rows.
        const std::size_t items = bc * d.cig, per = ceil_div(items, std::min(items, workers));
        std::vector<std::uint64_t> loads(workers, 0);
        for (std::size_t t0 = 0; t0 < items; t0 += per)
          *std::min_element(loads.begin(), loads.end()) +=
              mac_cycles(arch,
                         static_cast<double>(std::min(items, t0 + per) - t0) * d.taps * bn *
                             static_cast<double>(br * d.ow),
                         d.dtype, {0, double(d.cog), d.half_partials});
        double cycles = static_cast<double>(*std::max_element(loads.begin(), loads.end())) +
                        exchange_cycles(arch, in + dy);
        double bytes = in + dy + partial;
        if (parts > 1) {  // gather the other parts' slices, sum them
          const double gathered = partial * static_cast<double>(parts - 1) / parts;
          bytes += gathered + partial / parts;
          cycles += exchange_cycles(arch, gathered) +
                    static_cast<double>(arch.sync_cycles_internal) +
                    static_cast<double>(
                        vector_cycles(arch, static_cast<std::size_t>(partial / 4.0 / parts), 1) *
                        parts / arch.workers_per_tile);
        }
        return Estimate{bytes, cycles};
      });
}

}  // namespace conv_impl

using conv_impl::Dims;
using conv_impl::expect;
using conv_impl::Index;
using conv_impl::make_dims;
using conv_impl::plan_forward;
using conv_impl::shape_str;
using conv_impl::signed_of;

std::size_t conv_output_size(std::size_t in, std::size_t pad_sum, std::size_t kernel,
                             std::size_t dilation, std::size_t stride) {
  if (kernel == 0 || stride == 0 || dilation == 0) return 0;
  const std::size_t span = dilation * (kernel - 1) + 1;
  if (in + pad_sum < span) return 0;
  return (in + pad_sum - span) / stride + 1;
}

std::vector<std::size_t> conv2d_output_shape(const std::vector<std::size_t>& x_shape,
                                             const std::vector<std::size_t>& w_shape,
                                             const ConvParams& params, const std::string& name) {
  const Dims d = make_dims(x_shape, w_shape, params, name);
  return {d.n, d.co, d.oh, d.ow};
}

std::vector<std::size_t> conv_transpose2d_output_shape(const std::vector<std::size_t>& x,
                                                       const std::vector<std::size_t>& wt,
                                                       const ConvParams& p,
                                                       const std::string& name) {
  expect(x.size() == 4, name, "input must be [n, channels, height, width], got " + shape_str(x));
  expect(
      p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1,
      name, "groups, strides and dilations must be at least 1");
  expect(wt.size() == 4 && wt[0] == x[1] && x[1] % p.groups == 0 && wt[2] >= 1 && wt[3] >= 1, name,
         "weight must be [" + std::to_string(x[1]) +
             ", out_channels/groups, kh, kw] with in_channels divisible by groups " +
             std::to_string(p.groups) + ", got " + shape_str(wt));
  expect(p.output_padding_h < std::max(p.stride_h, p.dilation_h) &&
             p.output_padding_w < std::max(p.stride_w, p.dilation_w),
         name,
         "output_padding " + std::to_string(p.output_padding_h) + "x" +
             std::to_string(p.output_padding_w) + " must be smaller than stride or dilation");
  const Index oh = signed_of((x[2] - 1) * p.stride_h) - signed_of(p.pad_top + p.pad_bottom) +
                   signed_of(p.dilation_h * (wt[2] - 1) + p.output_padding_h + 1);
  const Index ow = signed_of((x[3] - 1) * p.stride_w) - signed_of(p.pad_left + p.pad_right) +
                   signed_of(p.dilation_w * (wt[3] - 1) + p.output_padding_w + 1);
  expect(x[2] > 0 && x[3] > 0 && oh > 0 && ow > 0, name,
         "padding leaves no output for input " + shape_str(x) + " and weight " + shape_str(wt));
  return {x[0], wt[1] * p.groups, static_cast<std::size_t>(oh), static_cast<std::size_t>(ow)};
}

ConvPlan plan_conv2d(const ArchPreset& arch, const std::vector<std::size_t>& x_shape,
                     const std::vector<std::size_t>& w_shape, const ConvParams& params,
                     double proportion) {
  return plan_forward(arch, proportion, make_dims(x_shape, w_shape, params, "conv2d"));
}

}  // namespace ipupod::ipu::ops

// Finite-volume operator, MIC(0)-preconditioned conjugate gradients and the bounds. The operator
// is stored as face conductances (matrix-free): the diagonal plus east and south couplings.
#include "datasets/conductivity.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ipupod::datasets {
namespace {

// MIC(0) parameters (Bridson, "Fluid Simulation for Computer Graphics", ch. 5): a modification
// weight a little below 1 keeps the factorisation stable; a pivot below kSafety x the diagonal
// falls back to the diagonal.
constexpr double kModification = 0.97;
constexpr double kSafety = 0.25;
constexpr std::size_t kIterationsPerCell = 10;

// The symmetric positive definite system A u = b of the finite-volume discretisation.
struct System {
  std::size_t height = 0, width = 0;
  std::vector<double> diagonal, east, south, rhs;
  std::vector<double> west_boundary, east_boundary;  // conductance of each row's end faces
};

System assemble(std::span<const double> k, std::size_t height, std::size_t width) {
  System s{height,
           width,
           std::vector<double>(k.size()),
           std::vector<double>(k.size()),
           std::vector<double>(k.size()),
           std::vector<double>(k.size()),
           std::vector<double>(height),
           std::vector<double>(height)};
  auto face = [](double a, double b) { return 2 * a * b / (a + b); };  // harmonic mean
  for (std::size_t y = 0; y < height; ++y) {
    for (std::size_t x = 0; x < width; ++x) {
      const std::size_t i = y * width + x;
      if (x + 1 < width) {
        s.east[i] = face(k[i], k[i + 1]);
        s.diagonal[i] += s.east[i];
        s.diagonal[i + 1] += s.east[i];
      }
      if (y + 1 < height) {
        s.south[i] = face(k[i], k[i + width]);
        s.diagonal[i] += s.south[i];
        s.diagonal[i + width] += s.south[i];
      }
    }
    // Half a cell from the centre to the boundary face: conductance 2k.
    s.west_boundary[y] = 2 * k[y * width];
    s.east_boundary[y] = 2 * k[y * width + width - 1];
    s.diagonal[y * width] += s.west_boundary[y];
    s.diagonal[y * width + width - 1] += s.east_boundary[y];
    s.rhs[y * width] += s.west_boundary[y] * 1.0;  // potential 1 on the west face
  }
  return s;
}

void apply(const System& s, const std::vector<double>& u, std::vector<double>& out) {
  const std::size_t w = s.width;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const std::size_t x = i % w;
    double value = s.diagonal[i] * u[i];
    if (x + 1 < w) value -= s.east[i] * u[i + 1];
    if (x > 0) value -= s.east[i - 1] * u[i - 1];
    if (i + w < u.size()) value -= s.south[i] * u[i + w];
    if (i >= w) value -= s.south[i - w] * u[i - w];
    out[i] = value;
  }
}

// Pivots of the MIC(0) factorisation M = (D + L) D^-1 (D + L^T), L the strict lower part of A.
std::vector<double> factorise(const System& s) {
  const std::size_t w = s.width;
  std::vector<double> pivot(s.diagonal.size());
  for (std::size_t i = 0; i < pivot.size(); ++i) {
    const std::size_t x = i % w;
    double d = s.diagonal[i];
    if (x > 0) {
      const double c = s.east[i - 1];  // coupling to the west neighbour
      const double fill = (i - 1 + w < pivot.size()) ? s.south[i - 1] : 0.0;
      d -= c * (c + kModification * fill) / pivot[i - 1];
    }
    if (i >= w) {
      const double c = s.south[i - w];  // coupling to the north neighbour
      const double fill = (x + 1 < w) ? s.east[i - w] : 0.0;
      d -= c * (c + kModification * fill) / pivot[i - w];
    }
    pivot[i] = d < kSafety * s.diagonal[i] ? s.diagonal[i] : d;
  }
  return pivot;
}

void precondition(const System& s, const std::vector<double>& pivot, const std::vector<double>& r,
                  std::vector<double>& z) {
  const std::size_t w = s.width, n = r.size();
  for (std::size_t i = 0; i < n; ++i) {  // (D + L) y = r
    double value = r[i];
    if (i % w > 0) value += s.east[i - 1] * z[i - 1];
    if (i >= w) value += s.south[i - w] * z[i - w];
    z[i] = value / pivot[i];
  }
  for (std::size_t i = n; i-- > 0;) {  // (D + L^T) z = D y
    double value = 0;
    if (i % w + 1 < w) value += s.east[i] * z[i + 1];
    if (i + w < n) value += s.south[i] * z[i + w];
    z[i] += value / pivot[i];
  }
}

std::string scientific(double value) {
  std::ostringstream text;
  text << std::scientific << std::setprecision(2) << value;
  return text.str();
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

ConductivitySolution solve_effective_conductivity(std::span<const double> k, std::size_t height,
                                                  std::size_t width,
                                                  const ConductivitySolveOptions& options) {
  if (height == 0 || width == 0 || k.size() != height * width) {
    throw std::invalid_argument("conductivity solve: " + std::to_string(k.size()) +
                                " conductivities for a " + std::to_string(height) + "x" +
                                std::to_string(width) + " grid");
  }
  for (double value : k) {
    if (!(value > 0) || !std::isfinite(value)) {
      throw std::invalid_argument(
          "conductivity solve: every cell conductivity must be positive "
          "and finite, got " +
          std::to_string(value));
    }
  }
  const System system = assemble(k, height, width);
  const std::vector<double> pivot = factorise(system);
  const std::size_t n = k.size();
  const std::size_t max_iterations =
      options.max_iterations ? options.max_iterations : kIterationsPerCell * n;

  // Start from the linear profile of a uniform medium: already exact for layers along the field.
  std::vector<double> u(n), r(n), z(n), p(n), q(n);
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = 1.0 - (static_cast<double>(i % width) + 0.5) / static_cast<double>(width);
  }
  apply(system, u, q);
  for (std::size_t i = 0; i < n; ++i) r[i] = system.rhs[i] - q[i];
  const double rhs_norm = std::sqrt(dot(system.rhs, system.rhs));
  double residual = std::sqrt(dot(r, r)) / rhs_norm;
  precondition(system, pivot, r, z);
  p = z;
  double rz = dot(r, z);
  ConductivitySolution solution;
  while (residual > options.tolerance) {
    if (solution.iterations == max_iterations) {
      throw std::runtime_error(
          "conductivity solve on a " + std::to_string(height) + "x" + std::to_string(width) +
          " grid did not reach the relative residual " + scientific(options.tolerance) + " in " +
          std::to_string(max_iterations) + " iterations (at " + scientific(residual) +
          "); raise the tolerance or lower the phase contrast");
    }
    apply(system, p, q);
    const double alpha = rz / dot(p, q);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] += alpha * p[i];
      r[i] -= alpha * q[i];
    }
    residual = std::sqrt(dot(r, r)) / rhs_norm;
    precondition(system, pivot, r, z);
    const double rz_next = dot(r, z);
    const double beta = rz_next / rz;
    rz = rz_next;
    for (std::size_t i = 0; i < n; ++i) p[i] = z[i] + beta * p[i];
    ++solution.iterations;
  }
  double west = 0, east = 0;
  for (std::size_t y = 0; y < height; ++y) {
    west += system.west_boundary[y] * (1.0 - u[y * width]);
    east += system.east_boundary[y] * u[y * width + width - 1];
  }
  solution.effective =
      0.5 * (west + east) * static_cast<double>(width) / static_cast<double>(height);
  solution.relative_residual = residual;
  return solution;
}

ConductivityBounds wiener_bounds(double k1, double k2, double fraction1) {
  const double fraction2 = 1 - fraction1;
  return {1.0 / (fraction1 / k1 + fraction2 / k2), fraction1 * k1 + fraction2 * k2};
}

ConductivityBounds hashin_shtrikman_bounds_2d(double k1, double k2, double fraction1) {
  constexpr double kDimension = 2;
  const double high = std::max(k1, k2), low = std::min(k1, k2);
  const double high_fraction = k1 >= k2 ? fraction1 : 1 - fraction1;
  const double low_fraction = 1 - high_fraction;
  if (high == low) return {high, high};
  return {low + high_fraction / (1 / (high - low) + low_fraction / (kDimension * low)),
          high + low_fraction / (1 / (low - high) + high_fraction / (kDimension * high))};
}

}  // namespace ipupod::datasets

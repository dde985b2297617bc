// Send, receive and external sync between two emulated IPUs, bound to an in-process mailbox
// the way the pod binds them to the fabric: data arrives intact, the receiver pays the link
// time, and an external sync makes both devices wait for the slower one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "tests/ipu/mailbox.hpp"

namespace ipupod::ipu {
namespace {

TEST(TransferTest, ActivationsCrossAndSyncWaitsForTheSlowerDevice) {
  const ArchPreset& arch = ArchPreset::get("tiny");
  // IPU 0: x -> exp(x) on a lot of data (slow), sends it, then syncs.
  Graph g0(arch);
  Tensor x = g0.add_variable(DType::f32, {40, 257}, "x");
  g0.map_linearly(x, 257);
  g0.set_host_access(x);
  Program p0;
  Tensor y = ops::unary(g0, p0, ops::UnaryOp::exp, x, 0.f, "y");
  p0.add(Program::send(y, 1, 7));
  p0.add(Program::sync(SyncKind::external));
  // IPU 1: receives into its own buffer, doubles it, syncs.
  Graph g1(arch);
  Tensor r = g1.add_variable(DType::f32, {40, 257}, "received");
  g1.map_linearly(r);
  Program p1;
  p1.add(Program::receive(r, 0, 7));
  Tensor two = ops::binary(g1, p1, ops::BinaryOp::add, r, r, "two");
  g1.set_host_access(two);
  p1.add(Program::sync(SyncKind::external));

  Engine e0(g0, {{"p", p0}}), e1(g1, {{"p", p1}});
  testing_support::Mailbox mail(2);
  e0.bind_collectives(mail.binding(0));
  e1.bind_collectives(mail.binding(1));
  std::vector<float> xv(40 * 257);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i % 97) / 50.f - 1.f;
  e0.write(x, std::as_bytes(std::span(xv)));
  std::thread t0([&] { e0.run("p"); });
  e1.run("p");
  t0.join();

  const auto bytes = e1.read(two);
  std::vector<float> got(bytes.size() / 4);
  std::memcpy(got.data(), bytes.data(), bytes.size());
  for (std::size_t i = 0; i < xv.size(); ++i)
    ASSERT_NEAR(got[i], 2 * std::exp(xv[i]), 1e-5 * got[i]) << i;
  // The receiver paid the transfer; after the sync both clocks agree.
  EXPECT_GT(e1.cycles().fabric, 0u);
  EXPECT_EQ(e0.cycles().fabric, 0u);
  EXPECT_EQ(e0.cycles().total(), e1.cycles().total());
  EXPECT_GT(e0.cycles().compute, 0u);
}

TEST(TransferTest, RunningWithoutABindingIsAClearError) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {4}, "x");
  g.map_linearly(x);
  Engine e(g, {{"p", Program::send(x, 1, 0)}});
  EXPECT_THROW(e.run("p"), std::logic_error);
}

}  // namespace
}  // namespace ipupod::ipu

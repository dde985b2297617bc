// The loopback fabric's own contract: MPI-style matching and ordering, size checks, and
// failures that end every participant promptly instead of hanging.
#include "fabric/loopback_transport.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <vector>

#include "fabric/collectives.hpp"

namespace ipupod::fabric {
namespace {

std::span<const std::byte> as_bytes_of(const int& value) {
  return std::as_bytes(std::span(&value, 1));
}
std::span<std::byte> as_writable_bytes_of(int& value) {
  return std::as_writable_bytes(std::span(&value, 1));
}

TEST(LoopbackTransport, MessagesWithTheSameTagArriveInSendOrder) {
  run_on_loopback(2, [](Transport& t) {
    if (t.rank() == 0) {
      std::array<int, 3> values{10, 20, 30};
      std::array<Request, 3> sends;
      for (int i = 0; i < 3; ++i) sends[i] = t.isend(1, as_bytes_of(values[i]), 5);
      t.wait_all(sends);
    } else {
      std::array<int, 3> got{};
      std::array<Request, 3> recvs;
      for (int i = 0; i < 3; ++i) recvs[i] = t.irecv(0, as_writable_bytes_of(got[i]), 5);
      // Waiting out of order must not change which message lands where.
      t.wait(recvs[2]);
      t.wait(recvs[0]);
      t.wait(recvs[1]);
      EXPECT_EQ(got, (std::array<int, 3>{10, 20, 30}));
    }
  });
}

TEST(LoopbackTransport, TagsSelectMessages) {
  run_on_loopback(2, [](Transport& t) {
    if (t.rank() == 0) {
      const int a = 1;
      const int b = 2;
      Request first = t.isend(1, as_bytes_of(a), 7);
      Request second = t.isend(1, as_bytes_of(b), 8);
      std::array<Request, 2> sends{std::move(first), std::move(second)};
      t.wait_all(sends);
    } else {
      int from_tag_8 = 0;
      int from_tag_7 = 0;
      Request r8 = t.irecv(0, as_writable_bytes_of(from_tag_8), 8);
      t.wait(r8);
      Request r7 = t.irecv(0, as_writable_bytes_of(from_tag_7), 7);
      t.wait(r7);
      EXPECT_EQ(from_tag_7, 1);
      EXPECT_EQ(from_tag_8, 2);
    }
  });
}

TEST(LoopbackTransport, WaitedRequestIsEmptyAndWaitingAgainIsANoOp) {
  run_on_loopback(1, [](Transport& t) {
    int value = 42;
    int got = 0;
    Request recv = t.irecv(0, as_writable_bytes_of(got), 1);
    Request send = t.isend(0, as_bytes_of(value), 1);
    EXPECT_TRUE(recv.pending());
    t.wait(send);
    t.wait(recv);
    EXPECT_FALSE(recv.pending());
    t.wait(recv);
    EXPECT_EQ(got, 42);
  });
}

TEST(LoopbackTransport, TestCompletesOnlyOnceTheMessageIsMatched) {
  LoopbackFabric fabric(2, std::chrono::milliseconds(200));
  Transport& sender = fabric.endpoint(0);
  Transport& receiver = fabric.endpoint(1);
  int value = 9, got = 0;
  Request send = sender.isend(1, as_bytes_of(value), 3);
  EXPECT_FALSE(sender.test(send));  // rendezvous: no receive posted yet
  EXPECT_TRUE(send.pending());
  Request recv = receiver.irecv(0, as_writable_bytes_of(got), 3);
  EXPECT_TRUE(sender.test(send));
  EXPECT_FALSE(send.pending());
  EXPECT_TRUE(sender.test(send));  // an empty request is complete
  EXPECT_TRUE(receiver.test(recv));
  EXPECT_EQ(got, 9);
  Request unmatched = receiver.irecv(0, as_writable_bytes_of(got), 4);
  EXPECT_FALSE(receiver.test(unmatched));
  fabric.abort("test over");
  EXPECT_THROW(receiver.test(unmatched), FabricError);
}

TEST(LoopbackTransport, SizeMismatchNamesPeerTagAndBytes) {
  try {
    run_on_loopback(2, [](Transport& t) {
      std::array<std::byte, 8> buffer{};
      if (t.rank() == 0) {
        Request send = t.isend(1, buffer, 9);
        t.wait(send);
      } else {
        Request recv = t.irecv(0, std::span(buffer).first(4), 9);
        t.wait(recv);
      }
    });
    FAIL() << "expected FabricError";
  } catch (const FabricError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("tag 9"), std::string::npos) << text;
    EXPECT_NE(text.find("8 bytes"), std::string::npos) << text;
    EXPECT_NE(text.find("expects 4"), std::string::npos) << text;
  }
}

TEST(LoopbackTransport, BadPeerAndTagAreRejected) {
  LoopbackFabric fabric(2);
  std::array<std::byte, 1> buffer{};
  EXPECT_THROW(fabric.endpoint(0).isend(2, buffer, 0), FabricError);
  EXPECT_THROW(fabric.endpoint(0).irecv(-1, buffer, 0), FabricError);
  EXPECT_THROW(fabric.endpoint(0).isend(1, buffer, -3), FabricError);
  EXPECT_THROW(fabric.endpoint(2), FabricError);
  EXPECT_THROW(LoopbackFabric(0), FabricError);
}

TEST(LoopbackTransport, RequestFromAnotherTransportIsRejected) {
  LoopbackFabric fabric(2);
  int value = 1;
  Request send = fabric.endpoint(0).isend(1, as_bytes_of(value), 0);
  EXPECT_THROW(fabric.endpoint(1).wait(send), FabricError);
}

TEST(LoopbackTransport, FailureOnOneParticipantEndsTheOthersPromptly) {
  const auto start = std::chrono::steady_clock::now();
  try {
    run_on_loopback(4, [](Transport& t) {
      if (t.rank() == 2) throw FabricError("rank 2 gives up");
      barrier(t);  // the others would wait here forever without the abort
    });
    FAIL() << "expected the participant's exception";
  } catch (const FabricError& error) {
    EXPECT_STREQ(error.what(), "rank 2 gives up");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(LoopbackTransport, UnmatchedReceiveTimesOut) {
  LoopbackFabric fabric(2, std::chrono::milliseconds(50));
  int got = 0;
  Request recv = fabric.endpoint(1).irecv(0, as_writable_bytes_of(got), 3);
  try {
    fabric.endpoint(1).wait(recv);
    FAIL() << "expected a timeout";
  } catch (const FabricError& error) {
    EXPECT_NE(std::string(error.what()).find("timed out"), std::string::npos) << error.what();
  }
}

TEST(LoopbackTransport, SendsAreRendezvousLikeLargeMpiMessages) {
  // Both ranks wait for their send before posting the receive: this deadlocks on MPI for
  // large messages, so the loopback must not hide it.
  LoopbackFabric fabric(2, std::chrono::milliseconds(50));
  int value = 5;
  Request send = fabric.endpoint(0).isend(1, as_bytes_of(value), 0);
  EXPECT_THROW(fabric.endpoint(0).wait(send), FabricError);
}

TEST(Collectives, BroadcastRejectsBadRoot) {
  run_on_loopback(3, [](Transport& t) {
    std::array<std::byte, 4> data{};
    EXPECT_THROW(broadcast(t, data, 3), FabricError);
    EXPECT_THROW(broadcast(t, data, -1), FabricError);
  });
}

TEST(Collectives, RingChunksCoverTheBufferInOrder) {
  for (int n : {1, 2, 3, 7}) {
    for (std::size_t length : {0U, 1U, 5U, 100U}) {
      std::size_t next = 0;
      for (int c = 0; c < n; ++c) {
        const RingChunk chunk = ring_chunk(length, n, c);
        EXPECT_EQ(chunk.begin, next);
        EXPECT_LE(chunk.size(), length / n + 1);
        next = chunk.end;
      }
      EXPECT_EQ(next, length);
    }
  }
}

}  // namespace
}  // namespace ipupod::fabric

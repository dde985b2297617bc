// Collective algorithms written only against the Transport contract, so the same code runs
// over MPI and over the loopback fabric.
#include "fabric/collectives.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace ipupod::fabric {
namespace {

int ring_index(int value, int participants) {
  return ((value % participants) + participants) % participants;
}

std::span<const std::byte> bytes_of(std::span<const float> values) {
  return std::as_bytes(values);
}
std::span<std::byte> writable_bytes_of(std::span<float> values) {
  return std::as_writable_bytes(values);
}

void reduce_into(std::span<float> accumulator, std::span<const float> incoming, ReduceOp op) {
  // accumulator holds the partial result of the ranks before us in the ring; the incoming
  // partial result is the left operand so the order is ((x_c op x_{c+1}) op ...).
  if (op == ReduceOp::max) {
    for (std::size_t i = 0; i < accumulator.size(); ++i) {
      accumulator[i] = std::max(incoming[i], accumulator[i]);
    }
  } else {
    for (std::size_t i = 0; i < accumulator.size(); ++i)
      accumulator[i] = incoming[i] + accumulator[i];
  }
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::max:
      return "max";
  }
  return "unknown";
}

RingChunk ring_chunk(std::size_t length, int participants, int chunk) {
  if (participants < 1 || chunk < 0 || chunk >= participants) {
    throw FabricError("ring_chunk: chunk " + std::to_string(chunk) + " of " +
                      std::to_string(participants) + " participants is out of range");
  }
  const auto n = static_cast<std::size_t>(participants);
  const auto c = static_cast<std::size_t>(chunk);
  const std::size_t base = length / n;
  const std::size_t remainder = length % n;
  RingChunk result;
  result.begin = c * base + std::min(c, remainder);
  result.end = result.begin + base + (c < remainder ? 1 : 0);
  return result;
}

void all_reduce(Transport& t, std::span<float> data, ReduceOp op) {
  const int n = t.size();
  const int rank = t.rank();
  if (n > 1 && !data.empty()) {
    const int right = ring_index(rank + 1, n);
    const int left = ring_index(rank - 1, n);
    std::vector<float> incoming(ring_chunk(data.size(), n, 0).size());

    // Reduce-scatter: at step s rank r passes on its partial of chunk r-s and folds its own
    // values into the partial of chunk r-s-1. After n-1 steps rank r owns chunk r+1, complete.
    for (int step = 0; step < n - 1; ++step) {
      const RingChunk send = ring_chunk(data.size(), n, ring_index(rank - step, n));
      const RingChunk recv = ring_chunk(data.size(), n, ring_index(rank - step - 1, n));
      std::array<Request, 2> requests;
      if (send.size() > 0) {
        requests[0] = t.isend(right, bytes_of(data.subspan(send.begin, send.size())),
                              collective_tags::all_reduce_scatter);
      }
      std::span<float> partial(incoming.data(), recv.size());
      if (recv.size() > 0) {
        requests[1] =
            t.irecv(left, writable_bytes_of(partial), collective_tags::all_reduce_scatter);
      }
      t.wait_all(requests);
      reduce_into(data.subspan(recv.begin, recv.size()), partial, op);
    }

    if (op == ReduceOp::mean) {
      const RingChunk owned = ring_chunk(data.size(), n, ring_index(rank + 1, n));
      const auto divisor = static_cast<float>(n);
      for (std::size_t i = owned.begin; i < owned.end; ++i) data[i] = data[i] / divisor;
    }

    // All-gather: at step s rank r passes on complete chunk r+1-s and receives chunk r-s.
    for (int step = 0; step < n - 1; ++step) {
      const RingChunk send = ring_chunk(data.size(), n, ring_index(rank + 1 - step, n));
      const RingChunk recv = ring_chunk(data.size(), n, ring_index(rank - step, n));
      std::array<Request, 2> requests;
      if (send.size() > 0) {
        requests[0] = t.isend(right, bytes_of(data.subspan(send.begin, send.size())),
                              collective_tags::all_reduce_gather);
      }
      if (recv.size() > 0) {
        requests[1] = t.irecv(left, writable_bytes_of(data.subspan(recv.begin, recv.size())),
                              collective_tags::all_reduce_gather);
      }
      t.wait_all(requests);
    }
  }
}

void broadcast(Transport& t, std::span<std::byte> data, int root) {
  const int n = t.size();
  if (root < 0 || root >= n) {
    throw FabricError("broadcast on rank " + std::to_string(t.rank()) + ": root " +
                      std::to_string(root) + " is out of range, expected 0.." +
                      std::to_string(n - 1));
  }
  if (n == 1 || data.empty()) return;
  // Binomial tree over ranks renumbered so the root is 0: a rank receives from the rank that
  // differs in its lowest set bit, then sends to the ranks below that bit.
  const int relative = ring_index(t.rank() - root, n);
  int mask = 1;
  while (mask < n) {
    if ((relative & mask) != 0) {
      Request request =
          t.irecv(ring_index(relative - mask + root, n), data, collective_tags::broadcast);
      t.wait(request);
      break;
    }
    mask <<= 1;
  }
  std::vector<Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < n) {
      sends.push_back(
          t.isend(ring_index(relative + mask + root, n), data, collective_tags::broadcast));
    }
  }
  t.wait_all(sends);
}

void barrier(Transport& t) {
  const int n = t.size();
  const int rank = t.rank();
  // Dissemination: in round k every rank signals rank+2^k and hears from rank-2^k; after
  // ceil(log2 n) rounds every rank has (transitively) heard from every other.
  for (int distance = 1; distance < n; distance <<= 1) {
    const std::byte token_out{1};
    std::byte token_in{0};
    std::array<Request, 2> requests{
        t.isend(ring_index(rank + distance, n), std::span(&token_out, 1), collective_tags::barrier),
        t.irecv(ring_index(rank - distance, n), std::span(&token_in, 1), collective_tags::barrier)};
    t.wait_all(requests);
  }
}

}  // namespace ipupod::fabric

// Host instances: gathers to instance 0 and the messages between instances.
#include "pod/job/host_instances.hpp"

#include <cstring>
#include <stdexcept>

namespace ipupod::pod {
namespace {

template <class T>
std::vector<T> gather(MPI_Comm hosts, std::span<const T> values, MPI_Datatype type) {
  int rank = 0, size = 1;
  MPI_Comm_rank(hosts, &rank);
  MPI_Comm_size(hosts, &size);
  std::vector<T> all(rank == 0 ? values.size() * static_cast<std::size_t>(size) : 0);
  MPI_Gather(values.data(), static_cast<int>(values.size()), type, all.data(),
             static_cast<int>(values.size()), type, 0, hosts);
  return all;
}

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

template <class T>
T take(const std::string& in, std::size_t& at) {
  if (in.size() - at < sizeof(T)) throw std::runtime_error("host instance message cut short");
  T value;
  std::memcpy(&value, in.data() + at, sizeof value);
  at += sizeof value;
  return value;
}

}  // namespace

std::vector<float> gather_to_first(MPI_Comm hosts, std::span<const float> values) {
  return gather(hosts, values, MPI_FLOAT);
}

std::vector<std::uint64_t> gather_to_first(MPI_Comm hosts, std::span<const std::uint64_t> values) {
  return gather(hosts, values, MPI_UINT64_T);
}

std::string pack_arrays(const std::vector<const host::HostArray*>& arrays) {
  std::string out;
  put<std::uint64_t>(out, arrays.size());
  for (const host::HostArray* a : arrays) {
    put<std::uint8_t>(out, static_cast<std::uint8_t>(a->dtype));
    put<std::uint64_t>(out, a->shape.size());
    for (std::size_t d : a->shape) put<std::uint64_t>(out, d);
    put<std::uint64_t>(out, a->bytes.size());
    out.append(reinterpret_cast<const char*>(a->bytes.data()), a->bytes.size());
  }
  return out;
}

std::vector<host::HostArray> unpack_arrays(const std::string& packed) {
  std::size_t at = 0;
  std::vector<host::HostArray> arrays(take<std::uint64_t>(packed, at));
  for (host::HostArray& a : arrays) {
    a.dtype = static_cast<host::DType>(take<std::uint8_t>(packed, at));
    a.shape.resize(take<std::uint64_t>(packed, at));
    for (std::size_t& d : a.shape) d = take<std::uint64_t>(packed, at);
    const std::size_t bytes = take<std::uint64_t>(packed, at);
    if (packed.size() - at < bytes) throw std::runtime_error("host instance message cut short");
    const auto* begin = reinterpret_cast<const std::byte*>(packed.data() + at);
    a.bytes.assign(begin, begin + bytes);
    at += bytes;
  }
  return arrays;
}

void send_bytes(std::span<const std::byte> bytes, int to, int tag, MPI_Comm comm) {
  MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, tag, comm);
}

std::vector<std::byte> receive_bytes(int from, int tag, MPI_Comm comm) {
  MPI_Status status;
  MPI_Probe(from, tag, comm, &status);
  int n = 0;
  MPI_Get_count(&status, MPI_BYTE, &n);
  std::vector<std::byte> bytes(static_cast<std::size_t>(n));
  MPI_Recv(bytes.data(), n, MPI_BYTE, from, tag, comm, MPI_STATUS_IGNORE);
  return bytes;
}

}  // namespace ipupod::pod

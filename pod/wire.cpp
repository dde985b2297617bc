// Start-up record broadcast, serialised as JSON.
#include "pod/wire.hpp"

#include <nlohmann/json.hpp>

namespace ipupod::pod {

Startup broadcast_startup(const Startup& s, int root, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string text;
  if (rank == root)
    text = nlohmann::json{{"status", s.status},
                          {"message", s.message},
                          {"address", s.address},
                          {"port", s.port},
                          {"secret", s.secret},
                          {"sample_shape", s.sample_shape},
                          {"classes", s.classes},
                          {"train_steps", s.train_steps},
                          {"test_steps", s.test_steps},
                          {"resume", s.resume},
                          {"resume_epoch", s.resume_epoch},
                          {"resume_step", s.resume_step},
                          {"resume_host_step", s.resume_host_step},
                          {"resume_cycles", s.resume_cycles},
                          {"resume_shapes", s.resume_shapes}}
               .dump();
  unsigned long long length = text.size();
  MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, root, comm);
  text.resize(length);
  MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, root, comm);
  const auto j = nlohmann::json::parse(text);
  Startup out;
  out.status = j.at("status");
  out.message = j.at("message");
  out.address = j.at("address");
  out.port = j.at("port");
  out.secret = j.at("secret");
  out.sample_shape = j.at("sample_shape").get<std::vector<std::size_t>>();
  out.classes = j.at("classes");
  out.train_steps = j.at("train_steps");
  out.test_steps = j.at("test_steps");
  out.resume = j.at("resume");
  out.resume_epoch = j.at("resume_epoch");
  out.resume_step = j.at("resume_step");
  out.resume_host_step = j.at("resume_host_step");
  out.resume_cycles = j.at("resume_cycles").get<std::vector<std::uint64_t>>();
  out.resume_shapes = j.at("resume_shapes").get<std::map<std::string, std::vector<std::size_t>>>();
  return out;
}

void send_text(const std::string& text, int to, int tag, MPI_Comm comm) {
  MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, to, tag, comm);
}

std::string receive_text(int from, int tag, MPI_Comm comm) {
  MPI_Status status;
  MPI_Probe(from, tag, comm, &status);
  int n = 0;
  MPI_Get_count(&status, MPI_CHAR, &n);
  std::string text(static_cast<std::size_t>(n), '\0');
  MPI_Recv(text.data(), n, MPI_CHAR, from, tag, comm, MPI_STATUS_IGNORE);
  return text;
}

}  // namespace ipupod::pod

// Tests of StreamServer/StreamClient over real loopback TCP: two-way data with two clients,
// credit backpressure, authentication, and bounded waits when a peer is missing or gone.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "host/stream_client.hpp"
#include "host/stream_server.hpp"

namespace ipupod::host {
namespace {

using namespace std::chrono_literals;

// Generous: only reached when something is broken.
constexpr auto kPatience = 20s;

ServerConfig server_config(const std::string& secret, std::size_t clients) {
  ServerConfig config;
  config.secret = secret;
  config.clients = clients;
  config.timeout = kPatience;
  config.log = [](const std::string&) {};
  return config;
}

ClientConfig client_config(std::uint16_t port, const std::string& secret, std::size_t id,
                           std::size_t credits = 4) {
  ClientConfig config;
  config.port = port;
  config.secret = secret;
  config.client_id = id;
  config.credits = credits;
  config.timeout = kPatience;
  return config;
}

// Client 0, connected to a server that waits for just it, with `credits` frames of credit.
std::unique_ptr<StreamClient> connect_one(StreamServer& server, const std::string& secret,
                                          std::size_t credits = 4) {
  auto pending = std::async(std::launch::async, [&] {
    return std::make_unique<StreamClient>(client_config(server.port(), secret, 0, credits));
  });
  server.accept_clients();
  return pending.get();
}

Frame frame_of(std::uint16_t stream, std::uint64_t step, std::int32_t value) {
  return Frame{stream, step,
               HostArray::from_values<std::int32_t>({2}, std::vector<std::int32_t>{value, -value})};
}

// A hand-driven TCP peer (plain POSIX sockets) that can send bytes no StreamClient would.
class RawPeer {
 public:
  explicit RawPeer(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      throw std::runtime_error("RawPeer: cannot connect");
    }
  }
  ~RawPeer() { ::close(fd_); }
  void send(const std::vector<std::byte>& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Reads frames until a close frame and returns its reason ("" if the stream just ends).
  std::string close_reason() {
    const ReadExact read = [this](std::span<std::byte> buffer) {
      std::size_t done = 0;
      while (done < buffer.size()) {
        const ssize_t got = ::recv(fd_, buffer.data() + done, buffer.size() - done, 0);
        if (got <= 0) throw StreamError("end of stream");
        done += static_cast<std::size_t>(got);
      }
    };
    try {
      for (;;) {
        const WireFrame wire = read_frame(read);
        if (wire.kind == FrameKind::close) return array_text(wire.frame.array);
      }
    } catch (const StreamError&) {
      return "";
    }
  }

 private:
  int fd_ = -1;
};

struct LogLines {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> guard(mutex);
      lines.push_back(line);
    };
  }
  std::string all() {
    std::lock_guard<std::mutex> guard(mutex);
    std::string text;
    for (const auto& line : lines) text += line + "\n";
    return text;
  }
};

TEST(StreamSecret, IsHexAndRandom) {
  const std::string a = make_secret();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, make_secret());
}

TEST(Stream, TwoClientsRoundTripBothWays) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 2));
  ASSERT_NE(server.port(), 0);
  auto connect = [&](std::size_t id) {
    return std::async(std::launch::async, [&, id] {
      return std::make_unique<StreamClient>(client_config(server.port(), secret, id));
    });
  };
  auto first = connect(1);  // ids may arrive in any order
  auto second = connect(0);
  server.accept_clients();
  std::unique_ptr<StreamClient> clients[2] = {second.get(), first.get()};

  for (std::uint64_t step = 0; step < 3; ++step) {
    for (std::size_t c = 0; c < 2; ++c) {
      server.send(c, frame_of(7, step, static_cast<std::int32_t>(10 * c + step)));
    }
  }
  for (std::size_t c = 0; c < 2; ++c) {
    for (std::uint64_t step = 0; step < 3; ++step) {
      const Frame frame = clients[c]->receive();
      EXPECT_EQ(frame.stream, 7);
      EXPECT_EQ(frame.step, step);
      EXPECT_EQ(frame.array.as<std::int32_t>()[0], static_cast<std::int32_t>(10 * c + step));
      EXPECT_EQ(frame.array.as<std::int32_t>()[1], -static_cast<std::int32_t>(10 * c + step));
      clients[c]->send(frame_of(2, step, static_cast<std::int32_t>(100 + c)));
    }
  }
  for (std::size_t c = 0; c < 2; ++c) {
    for (std::uint64_t step = 0; step < 3; ++step) {
      const Frame frame = server.receive(c);
      EXPECT_EQ(frame.stream, 2);
      EXPECT_EQ(frame.step, step);
      EXPECT_EQ(frame.array.as<std::int32_t>()[0], static_cast<std::int32_t>(100 + c));
    }
  }
}

TEST(Stream, PiecesArriveAsOneArray) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 1));
  const std::unique_ptr<StreamClient> client = connect_one(server, secret);
  // 300 rows of 5 int32 from scattered places of one buffer (more pieces than one gather write
  // system call takes), in reverse order.
  const HostArray source = HostArray::from_values<std::int32_t>({600, 5}, [] {
    std::vector<std::int32_t> values(3000);
    std::iota(values.begin(), values.end(), 0);
    return values;
  }());
  const std::span<const std::byte> all(source.bytes);
  std::vector<std::span<const std::byte>> rows;
  for (std::size_t r = 300; r-- > 0;) rows.push_back(all.subspan(2 * r * 20, 20));
  const std::vector<std::size_t> shape = {300, 5};
  // The hook runs before the frame is written; what it throws ends the send.
  EXPECT_THROW(server.send(0, FrameView(4, 8, DType::i32, shape, rows),
                           [] { throw std::runtime_error("file truncated"); }),
               std::runtime_error);
  bool checked = false;
  server.send(0, FrameView(4, 9, DType::i32, shape, rows), [&] { checked = true; });
  EXPECT_TRUE(checked);
  const Frame frame = client->receive();
  EXPECT_EQ(frame.stream, 4);
  EXPECT_EQ(frame.step, 9u);
  ASSERT_EQ(frame.array.shape, shape);
  const std::span<const std::int32_t> got = frame.array.as<std::int32_t>();
  for (std::size_t k = 0; k < 300; ++k) {
    for (std::size_t j = 0; j < 5; ++j)
      ASSERT_EQ(got[5 * k + j], static_cast<std::int32_t>(10 * (299 - k) + j)) << k << "," << j;
  }
}

TEST(Stream, SendBlocksWhenTheClientHasNoCredit) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 1));
  const std::unique_ptr<StreamClient> client = connect_one(server, secret, 2);

  server.send(0, frame_of(0, 0, 1));
  server.send(0, frame_of(0, 1, 2));
  std::atomic<bool> third_sent{false};
  std::thread sender([&] {
    server.send(0, frame_of(0, 2, 3));
    third_sent = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(third_sent) << "the third send should wait for a credit";
  EXPECT_EQ(server.credits(0), 0u);

  EXPECT_EQ(client->receive().step, 0u);  // grants one credit back
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!third_sent && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  sender.join();
  EXPECT_TRUE(third_sent);
  EXPECT_EQ(client->receive().step, 1u);
  EXPECT_EQ(client->receive().step, 2u);
}

TEST(Stream, WrongSecretIsRefusedAndTheRightOneWorks) {
  const std::string secret = make_secret();
  std::mutex log_mutex;
  std::vector<std::string> log;
  ServerConfig config = server_config(secret, 1);
  config.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> guard(log_mutex);
    log.push_back(line);
  };
  StreamServer server(config);
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });

  try {
    StreamClient intruder(client_config(server.port(), "not-the-secret", 0));
    FAIL() << "a client with the wrong secret was accepted";
  } catch (const StreamError& error) {
    EXPECT_NE(std::string(error.what()).find("wrong secret"), std::string::npos) << error.what();
  }
  StreamClient good(client_config(server.port(), secret, 0));
  accepted.get();
  {
    std::lock_guard<std::mutex> guard(log_mutex);
    ASSERT_EQ(log.size(), 1u);
    EXPECT_NE(log[0].find("wrong secret"), std::string::npos) << log[0];
  }
  server.send(0, frame_of(1, 5, 9));
  EXPECT_EQ(good.receive().step, 5u);
}

TEST(Stream, ClientAcceptsAHostName) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 1));
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });
  ClientConfig config = client_config(server.port(), secret, 0);
  config.address = "localhost";
  StreamClient client(config);
  accepted.get();
  server.send(0, frame_of(0, 1, 1));
  EXPECT_EQ(client.receive().step, 1u);
}

TEST(Stream, DuplicateAndUnknownIdsAreRefused) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 2));
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });
  StreamClient zero(client_config(server.port(), secret, 0));
  EXPECT_THROW(StreamClient(client_config(server.port(), secret, 0)), StreamError);
  EXPECT_THROW(StreamClient(client_config(server.port(), secret, 5)), StreamError);
  StreamClient one(client_config(server.port(), secret, 1));
  accepted.get();
}

TEST(Stream, AcceptTimesOutNamingTheMissingClients) {
  ServerConfig config = server_config(make_secret(), 2);
  config.timeout = 200ms;
  StreamServer server(config);
  try {
    server.accept_clients();
    FAIL() << "expected a timeout";
  } catch (const StreamError& error) {
    EXPECT_NE(std::string(error.what()).find("missing client ids 0, 1"), std::string::npos)
        << error.what();
  }
}

TEST(Stream, ReceiveReportsADisconnectedClient) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 1));
  const std::unique_ptr<StreamClient> client = connect_one(server, secret);
  client->send(frame_of(0, 1, 1));
  client->close();
  EXPECT_EQ(server.receive(0).step, 1u);  // frames sent before the close still arrive
  try {
    server.receive(0);
    FAIL() << "expected StreamError";
  } catch (const StreamError& error) {
    EXPECT_NE(std::string(error.what()).find("client 0"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("closed"), std::string::npos) << error.what();
  }
  EXPECT_THROW(server.send(0, frame_of(0, 2, 2)), StreamError);
}

TEST(Stream, ClientSeesTheHostClosing) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 1));
  const std::unique_ptr<StreamClient> client = connect_one(server, secret);
  server.close();
  EXPECT_THROW(client->receive(), StreamError);
}

TEST(StreamRejects, CorruptFrameClosesTheConnectionWithALoggedReason) {
  const std::string secret = make_secret();
  LogLines log;
  ServerConfig config = server_config(secret, 1);
  config.log = log.sink();
  StreamServer server(config);
  RawPeer peer(server.port());
  peer.send(encode_frame(FrameKind::hello, Frame{0, 0, text_array(secret)}));
  server.accept_clients();
  auto corrupt = encode_frame(FrameKind::data, frame_of(1, 3, 77));
  corrupt[corrupt.size() - 6] ^= std::byte{0x01};  // a payload bit flipped in transit
  peer.send(encode_frame(FrameKind::data, frame_of(1, 2, 5)));
  peer.send(corrupt);
  EXPECT_EQ(server.receive(0).step, 2u);  // the good frame before it still arrives
  try {
    server.receive(0);
    FAIL() << "expected StreamError";
  } catch (const StreamError& error) {
    EXPECT_NE(std::string(error.what()).find("CRC32C mismatch"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("client 0"), std::string::npos) << error.what();
  }
  EXPECT_NE(log.all().find("CRC32C mismatch"), std::string::npos) << log.all();
  EXPECT_NE(peer.close_reason().find("CRC32C mismatch"), std::string::npos);
  EXPECT_THROW(server.send(0, frame_of(0, 4, 4)), StreamError);
}

TEST(StreamRejects, OversizedHelloIsRefusedBeforeAllocating) {
  const std::string secret = make_secret();
  LogLines log;
  ServerConfig config = server_config(secret, 1);
  config.log = log.sink();
  StreamServer server(config);
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });
  {
    RawPeer peer(server.port());
    auto hello = encode_frame(FrameKind::hello, Frame{0, 0, text_array(secret)});
    const std::uint64_t huge = std::uint64_t{512} << 20;  // 512 MiB claimed by a stranger
    std::memcpy(hello.data() + 20, &huge, 8);
    std::memcpy(hello.data() + kFrameHeaderBytes, &huge, 8);
    peer.send(hello);
    EXPECT_NE(peer.close_reason().find("exceeds the limit of 4096"), std::string::npos);
  }
  StreamClient good(client_config(server.port(), secret, 0));
  accepted.get();
  EXPECT_NE(log.all().find("exceeds the limit of 4096 bytes"), std::string::npos) << log.all();
  server.send(0, frame_of(0, 1, 1));
  EXPECT_EQ(good.receive().step, 1u);
}

// A stranger who connects and says nothing must not hold up the job's clients: every connection
// waits for its hello at the same time (before, one silent connection held the accept loop for
// its whole hello deadline, which the host set to the job's --timeout).
TEST(StreamStartUp, SilentStrangersDoNotDelayTheJobsClients) {
  const std::string secret = make_secret();
  LogLines log;
  ServerConfig config = server_config(secret, 2);
  config.hello_timeout = kPatience;  // the strangers would hold every slot for this long
  config.log = log.sink();
  StreamServer server(config);
  std::vector<std::unique_ptr<RawPeer>> strangers;
  for (int i = 0; i < 3; ++i) strangers.push_back(std::make_unique<RawPeer>(server.port()));
  const auto start = std::chrono::steady_clock::now();
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });
  StreamClient zero(client_config(server.port(), secret, 0));
  StreamClient one(client_config(server.port(), secret, 1));
  ASSERT_EQ(accepted.wait_for(5s), std::future_status::ready)
      << "the silent connections held up the job's clients";
  accepted.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  server.send(1, frame_of(0, 7, 7));
  EXPECT_EQ(one.receive().step, 7u);
  // The strangers still waiting were dropped, saying why.
  for (auto& stranger : strangers)
    EXPECT_NE(stranger->close_reason().find("every client of this job has connected"),
              std::string::npos);
  EXPECT_NE(log.all().find("every client of this job has connected"), std::string::npos)
      << log.all();
}

TEST(StreamStartUp, ASlowHelloIsDroppedAtItsOwnDeadline) {
  const std::string secret = make_secret();
  LogLines log;
  ServerConfig config = server_config(secret, 1);
  config.hello_timeout = 200ms;
  config.log = log.sink();
  StreamServer server(config);
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });
  RawPeer slow(server.port());
  // Half a hello, then nothing: dropped after 200 ms, long before the server's timeout.
  const auto hello = encode_frame(FrameKind::hello, Frame{0, 0, text_array(secret)});
  slow.send(std::vector<std::byte>(hello.begin(), hello.begin() + 10));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(slow.close_reason().find("no hello within 200 ms"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  StreamClient good(client_config(server.port(), secret, 0));
  accepted.get();
  EXPECT_NE(log.all().find("no hello within 200 ms"), std::string::npos) << log.all();
}

// More strangers than may wait at once: the oldest are dropped, memory stays bounded, and the
// job's client still gets in.
TEST(StreamStartUp, AFloodOfConnectionsIsBoundedAndTheClientStillGetsIn) {
  const std::string secret = make_secret();
  LogLines log;
  ServerConfig config = server_config(secret, 1);
  config.hello_timeout = kPatience;
  config.log = log.sink();
  StreamServer server(config);
  auto accepted = std::async(std::launch::async, [&] { server.accept_clients(); });
  std::vector<std::unique_ptr<RawPeer>> strangers;
  for (int i = 0; i < 100; ++i) strangers.push_back(std::make_unique<RawPeer>(server.port()));
  // The first stranger was pushed out by a later one (its close frame says so).
  EXPECT_NE(strangers.front()->close_reason().find("were waiting to say hello"), std::string::npos);
  StreamClient good(client_config(server.port(), secret, 0));
  ASSERT_EQ(accepted.wait_for(5s), std::future_status::ready);
  accepted.get();
  server.send(0, frame_of(0, 3, 3));
  EXPECT_EQ(good.receive().step, 3u);
}

// Once every client is in, the port closes: a late connection is refused at once instead of
// waiting unanswered in the listen queue.
TEST(StreamStartUp, ThePortClosesOnceEveryClientIsIn) {
  const std::string secret = make_secret();
  StreamServer server(server_config(secret, 1));
  const std::unique_ptr<StreamClient> client = connect_one(server, secret);
  EXPECT_THROW(RawPeer late(server.port()), std::runtime_error);
  server.send(0, frame_of(0, 1, 1));
  EXPECT_EQ(client->receive().step, 1u);
}

}  // namespace
}  // namespace ipupod::host

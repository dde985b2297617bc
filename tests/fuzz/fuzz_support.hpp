// The fuzz tests' shared parts: a seeded, time-bounded loop whose every input can be replayed on
// its own, and the byte and JSON mutations that turn valid inputs into nearly valid ones.
//   IPUPOD_FUZZ_SEED=N        another sequence of inputs (default: a fixed one, so CI repeats)
//   IPUPOD_FUZZ_SECONDS=X     time budget of each fuzz loop (default 1; the sanitizer build
//                             gets through fewer inputs in the same time)
//   IPUPOD_FUZZ_ITERATION=I   run only input I of the sequence (to replay a failure)
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace ipupod::fuzz {

using Rng = std::mt19937_64;
using Bytes = std::vector<std::byte>;

inline std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::strtoull(value, nullptr, 10) : fallback;
}

inline double budget_seconds() {
  const char* value = std::getenv("IPUPOD_FUZZ_SECONDS");
  return value && *value ? std::strtod(value, nullptr) : 1.0;
}

// True when IPUPOD_FUZZ_ITERATION replays one input (the loops' minimum counts do not apply).
inline bool replaying() {
  return std::getenv("IPUPOD_FUZZ_ITERATION") != nullptr;
}

// Runs `one(iteration, rng)` for inputs 0, 1, ... until `max_iterations` or the time budget,
// but at least `min_iterations` whatever the time (a loaded machine or a sanitizer build runs
// fewer per second), each with its own generator seeded from (seed, iteration) so that one input
// can be replayed. A failed expectation stops the loop and names the input. Returns the inputs
// run.
inline std::size_t fuzz_loop(const std::string& target, std::size_t max_iterations,
                             std::size_t min_iterations,
                             const std::function<void(std::size_t, Rng&)>& one) {
  const std::uint64_t seed = env_number("IPUPOD_FUZZ_SEED", 20);
  const std::uint64_t only = env_number("IPUPOD_FUZZ_ITERATION", UINT64_MAX);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(budget_seconds()));
  std::size_t done = 0;
  for (std::size_t i = only == UINT64_MAX ? 0 : only; i < max_iterations; ++i) {
    std::seed_seq seq{seed, static_cast<std::uint64_t>(i)};
    Rng rng(seq);
    one(i, rng);
    ++done;
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << target << ": input " << i << " of seed " << seed
                    << " failed; replay it with IPUPOD_FUZZ_SEED=" << seed
                    << " IPUPOD_FUZZ_ITERATION=" << i;
      break;
    }
    if (only != UINT64_MAX ||
        (done >= min_iterations && std::chrono::steady_clock::now() > deadline))
      break;
  }
  std::cerr << target << ": " << done << " inputs (seed " << seed << ")" << std::endl;
  return done;
}

inline std::size_t pick(Rng& rng, std::size_t n) {  // uniform in [0, n), n > 0
  return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
}

// Numbers at and past the edges of the types a parser converts to.
inline std::uint64_t extreme_u64(Rng& rng) {
  static const std::uint64_t values[] = {0,
                                         1,
                                         2,
                                         7,
                                         0x7F,
                                         0x80,
                                         0xFF,
                                         0x100,
                                         0xFFFF,
                                         0x10000,
                                         0x7FFFFFFF,
                                         0x80000000,
                                         0xFFFFFFFF,
                                         0x100000000,
                                         std::uint64_t{1} << 30,
                                         (std::uint64_t{1} << 30) + 1,
                                         0x7FFFFFFFFFFFFFFF,
                                         0x8000000000000000,
                                         0xFFFFFFFFFFFFFFFE,
                                         0xFFFFFFFFFFFFFFFF};
  if (pick(rng, 4) == 0) return rng();
  return values[pick(rng, std::size(values))];
}

// Byte-level mutations of a valid input: bit flips, truncation, extreme numbers written over
// it, bytes inserted or deleted, a splice with another input, or noise.
inline Bytes mutate_bytes(const Bytes& input, const Bytes& other, Rng& rng) {
  Bytes out = input;
  const int rounds = 1 + static_cast<int>(pick(rng, 3));
  for (int round = 0; round < rounds; ++round) {
    switch (pick(rng, 8)) {
      case 0:
      case 1: {  // flip 1..8 bits
        if (out.empty()) break;
        const std::size_t flips = 1 + pick(rng, 8);
        for (std::size_t k = 0; k < flips; ++k)
          out[pick(rng, out.size())] ^= std::byte{static_cast<unsigned char>(1U << pick(rng, 8))};
        break;
      }
      case 2:  // truncate
        out.resize(pick(rng, out.size() + 1));
        break;
      case 3: {  // an extreme number over 1, 2, 4 or 8 bytes
        if (out.empty()) break;
        const std::size_t width = std::size_t{1} << pick(rng, 4);
        const std::size_t at = pick(rng, out.size());
        const std::uint64_t value = extreme_u64(rng);
        for (std::size_t k = 0; k < width && at + k < out.size(); ++k)
          out[at + k] = std::byte{static_cast<unsigned char>(value >> (8 * k))};
        break;
      }
      case 4: {  // insert random bytes
        const std::size_t at = pick(rng, out.size() + 1);
        const std::size_t n = 1 + pick(rng, 16);
        Bytes noise(n);
        for (auto& b : noise) b = std::byte{static_cast<unsigned char>(rng())};
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), noise.begin(), noise.end());
        break;
      }
      case 5: {  // delete a run of bytes
        if (out.empty()) break;
        const std::size_t at = pick(rng, out.size());
        const std::size_t n = std::min(out.size() - at, 1 + pick(rng, 64));
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(at),
                  out.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 6: {  // splice: a prefix of this one, a suffix of the other
        if (other.empty()) break;
        const std::size_t cut = pick(rng, out.size() + 1);
        const std::size_t from = pick(rng, other.size());
        out.resize(cut);
        out.insert(out.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      default: {  // a block set to zeros or ones
        if (out.empty()) break;
        const std::size_t at = pick(rng, out.size());
        const std::size_t n = std::min(out.size() - at, 1 + pick(rng, 64));
        const std::byte fill = pick(rng, 2) ? std::byte{0} : std::byte{0xFF};
        for (std::size_t k = 0; k < n; ++k) out[at + k] = fill;
        break;
      }
    }
  }
  return out;
}

inline std::string mutate_text(const std::string& text, const std::string& other, Rng& rng) {
  const auto bytes = [](const std::string& s) {
    Bytes b(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) b[i] = static_cast<std::byte>(s[i]);
    return b;
  };
  const Bytes out = mutate_bytes(bytes(text), bytes(other), rng);
  return std::string(reinterpret_cast<const char*>(out.data()), out.size());
}

// Where json_text puts a value nested 100000 lists deep: deep enough to overflow the stack of
// any recursive walk of it (dump, copy), which a parser's error message must not make.
inline constexpr const char* kDeepMarker = "@deep@";

// A JSON value a field should never hold: extreme or wrongly typed, or nested deeply.
inline nlohmann::json odd_json_value(Rng& rng) {
  switch (pick(rng, 18)) {
    case 0:
      return -1;
    case 1:
      return 0;
    case 2:
      return std::numeric_limits<std::int64_t>::min();
    case 3:
      return std::numeric_limits<std::uint64_t>::max();
    case 4:
      return std::uint64_t{1} << 31;
    case 5:
      return std::uint64_t{1} << 63;
    case 6:
      return 1e308;
    case 7:
      return -1e308;
    case 8:
      return 0.5;
    case 9:
      return -0.0;
    case 10:
      return nullptr;
    case 11:
      return true;
    case 12:
      return "";
    case 13:
      return std::string(1000, 'x');
    case 14:
      return nlohmann::json::array();
    case 15:
      return nlohmann::json::object();
    case 16:
      return nlohmann::json::array({1, "two", nullptr});
    default:  // json_text nests a value here deeply (dump() itself would recurse)
      return kDeepMarker;
  }
}

// Tree-level mutations of a valid JSON document: a field set to an odd value, removed, renamed
// or duplicated under an unknown name; an array element changed; the document replaced.
inline nlohmann::json mutate_json(nlohmann::json doc, Rng& rng) {
  const int rounds = 1 + static_cast<int>(pick(rng, 2));
  for (int round = 0; round < rounds; ++round) {
    // Walk down from the root to a random container.
    nlohmann::json* at = &doc;
    while (at->is_structured() && !at->empty() && pick(rng, 3) != 0) {
      auto it = at->begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(rng, at->size())));
      if (!it->is_structured()) break;
      at = &*it;
    }
    if (!at->is_structured() || at->empty() || pick(rng, 20) == 0) {
      *at = odd_json_value(rng);
      continue;
    }
    auto it = at->begin();
    std::advance(it, static_cast<std::ptrdiff_t>(pick(rng, at->size())));
    if (at->is_array()) {
      *it = odd_json_value(rng);
      continue;
    }
    const std::string key = it.key();
    switch (pick(rng, 4)) {
      case 0:
        at->erase(key);
        break;
      case 1: {
        nlohmann::json value = std::move(*it);
        at->erase(key);
        (*at)[key + "_"] = std::move(value);
        break;
      }
      case 2:
        (*at)["unknown_field"] = 1;
        break;
      default:
        (*it) = odd_json_value(rng);
        break;
    }
  }
  return doc;
}

// The document as text, or, for some inputs, that text mutated byte by byte.
inline std::string json_text(const nlohmann::json& doc, const std::string& other, Rng& rng) {
  std::string text = doc.dump();
  const std::string marker = std::string("\"") + kDeepMarker + "\"";
  for (std::size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at)) {
    constexpr std::size_t kDepth = 100000;
    text.replace(at, marker.size(), std::string(kDepth, '[') + "1" + std::string(kDepth, ']'));
    at += 2 * kDepth + 1;
  }
  return pick(rng, 4) == 0 ? mutate_text(text, other, rng) : text;
}

}  // namespace ipupod::fuzz

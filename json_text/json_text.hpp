// JSON in error messages: a value shown short, a JSON library's message cut short. Header-only,
// for every layer that reads a JSON file (presets, topologies, configurations, checkpoints).
#pragma once

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace ipupod::json_text {

// A library's message cut short: a JSON parse error quotes the text it last read, which can be
// the whole of a long line.
inline std::string brief(const std::string& text) {
  constexpr std::size_t kBriefChars = 240;
  return text.size() > kBriefChars ? text.substr(0, kBriefChars) + "..." : text;
}

// A value as an error message shows it: a primitive or a short flat list or object printed (cut
// short), a nested or long one described by its size (one nested deeply would overflow the stack
// of dump(), a long one would drown the message).
inline std::string shown(const nlohmann::json& value) {
  // A short flat list or object is printed as it is (dump() recurses only one level).
  const bool flat =
      value.size() <= 16 &&
      std::all_of(value.begin(), value.end(), [](const auto& v) { return v.is_primitive(); });
  if (value.is_array() && !flat) return "a list of " + std::to_string(value.size()) + " value(s)";
  if (value.is_object() && !flat)
    return "an object of " + std::to_string(value.size()) + " field(s)";
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  constexpr std::size_t kShownChars = 64;
  if (text.size() > kShownChars) text = text.substr(0, kShownChars) + "...";
  return text;
}

}  // namespace ipupod::json_text

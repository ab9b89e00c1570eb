// A small ordered JSON object writer, shared by epcomm-bench (one record per line) and
// epcomm-check-env (--json). Only what the tools need: scalars, plus already-encoded values for
// nesting arrays and objects.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace epcomm::tools {

// `text` as a quoted JSON string, control characters escaped.
std::string json_string(const std::string& text);

// A JSON array of already-encoded values (the output of json_string, Record::to_json, ...).
std::string json_array(const std::vector<std::string>& json_values);

// An ordered JSON object with scalar values; setting a key again replaces its value in place.
class Record {
 public:
  Record& set(const std::string& key, const std::string& value);
  Record& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Record& set(const std::string& key, double value);  // non-finite values become null
  Record& set(const std::string& key, int64_t value);
  Record& set(const std::string& key, int value) { return set(key, static_cast<int64_t>(value)); }
  Record& set(const std::string& key, bool value);
  Record& set_null(const std::string& key);
  Record& set(const std::string& key, std::optional<double> value) { return value ? set(key, *value) : set_null(key); }
  // `json_value` must already be valid JSON (a nested object or array); it is written as is.
  Record& set_json(const std::string& key, std::string json_value);
  std::string to_json() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace epcomm::tools

#include "support/json_record.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace epcomm::tools {

std::string json_string(const std::string& text) {
  std::ostringstream out;
  out << '"';
  for (const char c : text) {
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\t': out << "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out << escaped;
        } else {
          out << c;
        }
    }
  }
  out << '"';
  return out.str();
}

std::string json_array(const std::vector<std::string>& json_values) {
  std::string json = "[";
  for (size_t i = 0; i < json_values.size(); ++i) json += (i ? ", " : "") + json_values[i];
  return json + "]";
}

Record& Record::set_json(const std::string& key, std::string json_value) {
  for (auto& field : fields_) {
    if (field.first == key) {
      field.second = std::move(json_value);
      return *this;
    }
  }
  fields_.emplace_back(key, std::move(json_value));
  return *this;
}

Record& Record::set(const std::string& key, const std::string& value) { return set_json(key, json_string(value)); }
Record& Record::set(const std::string& key, int64_t value) { return set_json(key, std::to_string(value)); }
Record& Record::set(const std::string& key, bool value) { return set_json(key, value ? "true" : "false"); }
Record& Record::set_null(const std::string& key) { return set_json(key, "null"); }
Record& Record::set(const std::string& key, double value) {
  if (!std::isfinite(value)) return set_null(key);
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", value);
  return set_json(key, text);
}

std::string Record::to_json() const {
  std::string json = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    json += (i ? ", " : "") + json_string(fields_[i].first) + ": " + fields_[i].second;
  }
  return json + "}";
}

}  // namespace epcomm::tools

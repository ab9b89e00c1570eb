// A strict little JSON checker for tests: is a text exactly one JSON object (nothing before or
// after it), with well-formed strings, numbers, arrays and nested objects?
#pragma once

#include <cctype>
#include <cstring>
#include <string>
#include <utility>

namespace epcomm::test_support {

class JsonChecker {
 public:
  explicit JsonChecker(std::string text) : text_(std::move(text)) {}
  bool is_one_object() {
    skip_space();
    if (peek() != '{' || !value()) return false;
    skip_space();
    return position_ == text_.size();
  }

 private:
  char peek() const { return position_ < text_.size() ? text_[position_] : '\0'; }
  void skip_space() {
    while (std::isspace(static_cast<unsigned char>(peek()))) ++position_;
  }
  bool literal(const char* word) {
    if (text_.compare(position_, std::strlen(word), word) != 0) return false;
    position_ += std::strlen(word);
    return true;
  }
  bool string() {
    if (peek() != '"') return false;
    for (++position_; position_ < text_.size(); ++position_) {
      const char c = text_[position_];
      if (c == '"') return ++position_, true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\' && ++position_ >= text_.size()) return false;
    }
    return false;
  }
  bool number() {
    const size_t start = position_;
    while (std::isdigit(static_cast<unsigned char>(peek())) || std::strchr("+-.eE", peek()) != nullptr) ++position_;
    return position_ > start;
  }
  template <typename Item>
  bool sequence(char close, Item item) {
    ++position_;
    skip_space();
    if (peek() == close) return ++position_, true;
    while (true) {
      skip_space();
      if (!item()) return false;
      skip_space();
      if (peek() == close) return ++position_, true;
      if (peek() != ',') return false;
      ++position_;
    }
  }
  bool value() {
    skip_space();
    switch (peek()) {
      case '{':
        return sequence('}', [this] {
          if (!string()) return false;
          skip_space();
          if (peek() != ':') return false;
          ++position_;
          return value();
        });
      case '[': return sequence(']', [this] { return value(); });
      case '"': return string();
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: return number();
    }
  }

  std::string text_;
  size_t position_ = 0;
};

}  // namespace epcomm::test_support

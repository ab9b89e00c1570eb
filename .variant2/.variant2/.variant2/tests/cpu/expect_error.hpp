// Checks that a call fails the way epcomm's error model promises: an epcomm::Error with code
// InvalidArgument whose message contains the offending argument and value.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "epcomm/error.hpp"

template <typename Call>
::testing::AssertionResult throws_invalid_argument(Call&& call, const std::string& expected_text) {
  try {
    call();
  } catch (const epcomm::Error& error) {
    const std::string message = error.what();
    if (error.code() != epcomm::ErrorCode::kInvalidArgument) {
      return ::testing::AssertionFailure() << "wrong error code: " << message;
    }
    if (message.find(expected_text) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << expected_text << "\"";
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no error thrown (expected one mentioning \"" << expected_text << "\")";
}

// EXPECT_INPUT_ERROR(statement, substring): statement throws sextant::InputError whose message
// contains substring.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "sextant/spec/error.hpp"

#define EXPECT_INPUT_ERROR(statement, substring)                                         \
  do {                                                                                   \
    try {                                                                                \
      statement;                                                                         \
      ADD_FAILURE() << "expected InputError containing \"" << (substring) << "\"";       \
    } catch (const ::sextant::InputError& e) {                                           \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();   \
    }                                                                                    \
  } while (false)

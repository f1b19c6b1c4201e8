// FlagArgs: both value spellings, switches, positional words, and errors that name the command and flag.
#include "cli/flag_args.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "core/error.h"

using ktune::Error;
using ktune::cli::Args;
using ktune::cli::FlagArgs;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(FlagArgs, ReadsBothValueSpellingsSwitchesAndWordsInOrder) {
  Args args = {"--model", "m", "--rank=8", "--chat", "src", "-", "--name=", "--x=a=b"};
  FlagArgs a("ktune t", args);
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.is("--model"));
  EXPECT_EQ(a.value(), "m");
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.is("--rank"));
  EXPECT_EQ(a.int_value(1, 64), 8);
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.is("--chat"));
  EXPECT_FALSE(a.positional());
  EXPECT_NO_THROW(a.expect_no_value());
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.positional());
  EXPECT_EQ(a.arg(), "src");
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.positional()) << "'-' is stdin, a word";
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.is("--name"));
  EXPECT_EQ(a.value(), "") << "an explicit empty value";
  ASSERT_TRUE(a.next());
  EXPECT_EQ(a.value(), "a=b") << "only the first '=' splits";
  EXPECT_FALSE(a.next());
}

TEST(FlagArgs, StartsWhereTold) {
  Args args = {"model", "--output-dir", "d"};
  FlagArgs a("ktune initializer", args, 1);
  ASSERT_TRUE(a.next());
  EXPECT_TRUE(a.is("--output-dir"));
  EXPECT_EQ(a.value(), "d");
  EXPECT_FALSE(a.next());
}

TEST(FlagArgs, ErrorsNameTheCommandAndTheFlag) {
  Args missing = {"--seed"};
  FlagArgs a("ktune init-model", missing);
  a.next();
  EXPECT_EQ(error_of([&] { a.value(); }), "ktune init-model --seed: needs a value");

  Args bad = {"--epochs", "3x", "--epochs=0", "--lr", "fast", "--on", "maybe", "--chat=yes", "--nope"};
  FlagArgs b("ktune train", bad);
  b.next();
  EXPECT_EQ(error_of([&] { b.int_value(1, 100); }), "ktune train --epochs: expects an integer, got '3x'");
  b.next();
  EXPECT_EQ(error_of([&] { b.int_value(1, 100); }), "ktune train --epochs: expects an integer in [1, 100], got 0");
  b.next();
  EXPECT_EQ(error_of([&] { b.number_value(); }), "ktune train --lr: expects a number, got 'fast'");
  b.next();
  EXPECT_EQ(error_of([&] { b.bool_value(); }), "ktune train --on: expects true or false, got 'maybe'");
  b.next();
  EXPECT_EQ(error_of([&] { b.expect_no_value(); }), "ktune train --chat: takes no value, got 'yes'");
  b.next();
  EXPECT_EQ(error_of([&] { b.unknown("usage: ktune train --runtime NAME"); }),
            "ktune train: unknown argument '--nope'\nusage: ktune train --runtime NAME");
}

TEST(FlagArgs, IntegersOutsideLongLongAreRefusedNotWrapped) {
  Args args = {"--seed", "99999999999999999999999"};
  FlagArgs a("ktune init-model", args);
  a.next();
  EXPECT_NE(error_of([&] { a.int_value(0, std::numeric_limits<long long>::max()); }).find("expects an integer"),
            std::string::npos);
}

// common/size_classes.hpp: the default output allocator's size classes, and which class serves
// each request.
#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <vector>

#include "common/size_classes.hpp"

namespace epcomm::detail {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(SizeClasses, SmallTensorsShareOneClassAndGetWhatTheyAskFor) {
  EXPECT_EQ(size_class_bytes(0), 0u);
  EXPECT_EQ(size_class_bytes(1), 0u);
  EXPECT_EQ(size_class_bytes(2 * kMiB), 0u);
}

TEST(SizeClasses, UpTo16MiBClassesAreWholePages) {
  EXPECT_EQ(size_class_bytes(2 * kMiB + 1), 4 * kMiB);
  EXPECT_EQ(size_class_bytes(6 * kMiB), 6 * kMiB);
  EXPECT_EQ(size_class_bytes(15 * kMiB + 5), 16 * kMiB);
  EXPECT_EQ(size_class_bytes(16 * kMiB), 16 * kMiB);
}

TEST(SizeClasses, EveryTensorFitsItsClassWithLittleMore) {
  size_t previous = 0;
  for (size_t bytes = 2 * kMiB + 1; bytes < (size_t{1} << 40); bytes = bytes + bytes / 7 + 12345) {
    const size_t given = size_class_bytes(bytes);
    ASSERT_GE(given, bytes) << bytes;
    ASSERT_EQ(given % kSizeClassGranule, 0u) << bytes;
    const double slack = static_cast<double>(given - bytes);
    ASSERT_LE(slack, 0.1893 * static_cast<double>(bytes) + static_cast<double>(kSizeClassGranule)) << bytes;
    ASSERT_GE(given, previous) << "classes grow with the size: " << bytes;
    previous = given;
  }
}

TEST(SizeClasses, ClassesAreSharedAndAQuarterOctaveApartAbove16MiB) {
  // Every size of a class gets the class's bytes: the next step's tensor reuses a freed one whole.
  EXPECT_EQ(size_class_bytes(200 * kMiB), size_class_bytes(203 * kMiB));
  std::set<size_t> classes;
  for (size_t bytes = 16 * kMiB + 1; bytes <= 1024 * kMiB; bytes += kMiB / 2) classes.insert(size_class_bytes(bytes));
  EXPECT_EQ(classes.size(), 24u) << "six octaves from 16 MiB to 1 GiB, four classes each";
  EXPECT_EQ(*classes.rbegin(), 1024 * kMiB);
  // A class is exactly its size: asking for it gives it back.
  for (const size_t size : classes) EXPECT_EQ(size_class_bytes(size), size);
}

TEST(SizeClasses, SizesNoDeviceHoldsAreTheirOwnClass) {
  // Past 1 PiB no class is computed (its size would overflow): the allocation fails as asked.
  EXPECT_EQ(size_class_bytes(kLargestClassBytes + 1), kLargestClassBytes + 1);
  EXPECT_EQ(size_class_bytes(~size_t{0}), ~size_t{0});
  EXPECT_GE(size_class_bytes(kLargestClassBytes), kLargestClassBytes);
}

// A stand-in for the pools: which classes have a free block.
struct FreeBlocks {
  std::set<size_t> classes;
  mutable std::vector<size_t> asked;
  bool operator()(size_t class_bytes) const {
    asked.push_back(class_bytes);
    return classes.count(class_bytes) > 0;
  }
};

TEST(SizeClassChooser, SmallTensorsGoToTheSharedClass) {
  SizeClassChooser chooser;
  FreeBlocks free;
  EXPECT_EQ(chooser.pick(kMiB, free), 0u);
  EXPECT_TRUE(free.asked.empty()) << "the shared class needs no free-block question";
}

TEST(SizeClassChooser, AFirstRequestGrowsItsOwnClassAskingNobody) {
  SizeClassChooser chooser;
  FreeBlocks free;
  EXPECT_EQ(chooser.pick(100 * kMiB, free), size_class_bytes(100 * kMiB));
  EXPECT_TRUE(free.asked.empty()) << "only classes chosen before are asked";
}

TEST(SizeClassChooser, ItsOwnClassFirstThenALargerOneUpToOneAndAHalfTimes) {
  SizeClassChooser chooser;
  const size_t own = size_class_bytes(100 * kMiB);
  const size_t next = size_class_bytes(own + 1);       // a quarter octave up
  const size_t far = size_class_bytes(own * 2);        // an octave up: past 1.5x
  for (const size_t made : {own, next, far}) chooser.choose(made);

  FreeBlocks all{{own, next, far}};
  EXPECT_EQ(chooser.pick(100 * kMiB, all), own) << "its own class has a free block";
  EXPECT_EQ(all.asked, std::vector<size_t>{own});

  FreeBlocks larger{{next, far}};
  EXPECT_EQ(chooser.pick(100 * kMiB, larger), next) << "borrows the next class's free block";
  EXPECT_EQ(larger.asked, (std::vector<size_t>{own, next}));

  FreeBlocks too_large{{far}};
  EXPECT_EQ(chooser.pick(100 * kMiB, too_large), own) << "an octave up is too much to borrow: its own grows";
  EXPECT_EQ(too_large.asked, (std::vector<size_t>{own, next})) << "classes past 1.5x are not asked";
}

TEST(SizeClassChooser, AWarmupsLargerClassServesCallsAClassLower) {
  SizeClassChooser chooser;
  const size_t warmed = size_class_bytes(60 * kMiB);
  chooser.choose(warmed);  // the warmup's tensors, freed since
  const size_t smaller_request = warmed - 10 * kMiB;  // a class lower
  ASSERT_LT(size_class_bytes(smaller_request), warmed);
  EXPECT_EQ(chooser.pick(smaller_request, FreeBlocks{{warmed}}), warmed);
}

TEST(SizeClassChooser, ClassesIdleFor1024RequestsAreDueEvery1024Requests) {
  SizeClassChooser chooser;
  const size_t busy = size_class_bytes(100 * kMiB), idle = size_class_bytes(300 * kMiB);
  constexpr uint64_t kIdle = SizeClassChooser::kIdleRequests;
  EXPECT_TRUE(chooser.choose(idle).empty());  // request 1
  // Requests 2 to 1024: at 1024 the idle class has waited 1023, not yet enough.
  for (uint64_t request = 2; request <= kIdle; ++request) ASSERT_TRUE(chooser.choose(busy).empty()) << request;
  // Then nothing is due between the multiples of 1024.
  for (uint64_t request = kIdle + 1; request < 2 * kIdle; ++request) ASSERT_TRUE(chooser.choose(busy).empty()) << request;
  EXPECT_EQ(chooser.choose(busy), std::vector<size_t>{idle}) << "request 2048: the idle class, never the busy one";
}

}  // namespace
}  // namespace epcomm::detail

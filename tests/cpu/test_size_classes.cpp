// common/size_classes.hpp: the default output allocator's size classes.
#include <gtest/gtest.h>

#include <cstddef>
#include <set>

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

}  // namespace
}  // namespace epcomm::detail

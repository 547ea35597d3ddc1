// SPDX-License-Identifier: Apache-2.0
#include "common/base/shared_vector.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace repvar {
namespace {

TEST(SharedVectorTest, Copies_ShareTheElements_UntilOneChanges) {
  SharedVector<std::string> a(std::vector<std::string>{"x", "y"});
  SharedVector<std::string> b = a;
  EXPECT_TRUE(b.SharesWith(a));
  EXPECT_EQ(&a[0], &b[0]);  // no copy of the elements

  b.Own()[0] = "changed";  // b gets its own elements first
  EXPECT_FALSE(b.SharesWith(a));
  EXPECT_EQ(a[0], "x");
  EXPECT_EQ(b[0], "changed");
  b.push_back("z");
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(b.size(), 3u);
}

TEST(SharedVectorTest, Reads_NeverCopy_EvenThroughANonConstVector) {
  SharedVector<int> a(std::vector<int>{1, 2, 3});
  SharedVector<int> b = a;
  int sum = 0;
  for (int x : b) sum += x;  // b is not const: its begin/end still only read
  sum += b[1] + b.front() + b.back();
  EXPECT_EQ(sum, 6 + 2 + 1 + 3);
  EXPECT_TRUE(b.SharesWith(a));
}

TEST(SharedVectorTest, AnUnsharedVector_ChangesInPlace) {
  SharedVector<int> a(std::vector<int>{1});
  const int* before = &a[0];
  a.Own()[0] = 2;
  EXPECT_EQ(&a[0], before);
  EXPECT_EQ(a[0], 2);
}

TEST(SharedVectorTest, Empty_ClearAndCompare) {
  SharedVector<int> empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.begin(), empty.end());
  EXPECT_FALSE(empty.SharesWith(SharedVector<int>()));
  SharedVector<int> a{1, 2};
  SharedVector<int> b = a;
  b.clear();  // drops b's hold only
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(a, (SharedVector<int>{1, 2}));  // by value, shared or not
  EXPECT_FALSE(a == b);
  EXPECT_EQ(b, empty);
}

TEST(SharedVectorTest, CopiesOnOtherThreads_ChangeIndependently) {
  SharedVector<int> base(std::vector<int>(1000, 1));
  std::vector<SharedVector<int>> copies(4, base);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&copies, t] {
      for (int& x : copies[t].Own()) x = t;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(copies[t][999], t);
    EXPECT_FALSE(copies[t].SharesWith(base));
  }
  EXPECT_EQ(base[0], 1);
}

}  // namespace
}  // namespace repvar

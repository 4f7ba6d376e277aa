// The entropy-collapse warning: once on entering the uniform or the zero band, again only
// after leaving it well clear of its edge; the first step only says where the policy starts.
#include <gtest/gtest.h>

#include <cmath>

#include "train/entropy_watch.h"

using tandem::EntropyWatch;

TEST(EntropyWatch, WarnsOnceOnEnteringUniformOrZero) {
  const double uniform = std::log(16.0);
  EntropyWatch watch(16);
  EXPECT_FALSE(watch.observe(uniform));  // a fresh model may start there
  EXPECT_FALSE(watch.observe(2.0));
  const auto rose = watch.observe(uniform - 1e-6);
  ASSERT_TRUE(rose);
  EXPECT_NE(rose->find("near log(vocab) = 2.772589"), std::string::npos) << *rose;
  EXPECT_FALSE(watch.observe(uniform));  // still there: said already
  EXPECT_FALSE(watch.observe(0.98 * uniform));  // 2% below: a real preference
  const auto fell = watch.observe(1e-4);
  ASSERT_TRUE(fell);
  EXPECT_NE(fell->find("collapsed"), std::string::npos) << *fell;
  EXPECT_FALSE(watch.observe(NAN));
  EXPECT_FALSE(watch.observe(0.0));
  EXPECT_FALSE(watch.observe(0.02));   // hovering at the edge, as a solved task does: said already
  EXPECT_FALSE(watch.observe(0.005));
  EXPECT_FALSE(watch.observe(0.5));    // well clear: normal again
  EXPECT_TRUE(watch.observe(0.001));
  EXPECT_TRUE(watch.observe(uniform));  // straight from zero to uniform: a new band
}

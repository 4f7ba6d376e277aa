#include <gtest/gtest.h>

#include <boost/program_options.hpp>
#include <sstream>
#include <stdexcept>

#include "deck/units.h"

using namespace tandem;

namespace {

std::string parse_error(void (*parse)(const std::string&), const std::string& text) {
  try {
    parse(text);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "accepted '" << text << "'";
  return "";
}

void parse_bytes_only(const std::string& text) { parse_bytes(text); }
void parse_seconds_only(const std::string& text) { parse_seconds(text); }

}  // namespace

TEST(DeckUnits, BytesAcceptEveryUnitInAnyCase) {
  EXPECT_EQ(parse_bytes("123").value, 123u);
  EXPECT_EQ(parse_bytes("7B").value, 7u);
  EXPECT_EQ(parse_bytes("4KB").value, 4000u);
  EXPECT_EQ(parse_bytes("4KiB").value, 4096u);
  EXPECT_EQ(parse_bytes("4 kib").value, 4096u);
  EXPECT_EQ(parse_bytes("2MB").value, 2000000u);
  EXPECT_EQ(parse_bytes("3MiB").value, 3u << 20);
  EXPECT_EQ(parse_bytes("1.5GiB").value, 1610612736u);
  EXPECT_EQ(parse_bytes("1gb").value, 1000000000u);
  EXPECT_EQ(parse_bytes("2TiB").value, 2ull << 40);
  EXPECT_EQ(parse_bytes("1TB").value, 1000000000000u);
  EXPECT_EQ(parse_bytes("18446744073709551615").value, 18446744073709551615ull);
}

TEST(DeckUnits, BadSizesNameTheAcceptedUnits) {
  const std::string unit = parse_error(parse_bytes_only, "4XB");
  EXPECT_NE(unit.find("unknown unit 'XB'"), std::string::npos) << unit;
  for (const char* name : {"KB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB"})
    EXPECT_NE(unit.find(name), std::string::npos) << unit << " lacks " << name;
  EXPECT_NE(parse_error(parse_bytes_only, "lots").find("expected a size"), std::string::npos);
  EXPECT_NE(parse_error(parse_bytes_only, "-1KiB").find("negative"), std::string::npos);
  EXPECT_NE(parse_error(parse_bytes_only, "20000000TiB").find("too large"), std::string::npos);
  EXPECT_NE(parse_error(parse_bytes_only, "18446744073709551616").find("too large"), std::string::npos);
}

TEST(DeckUnits, BytesFormatToTheLargestExactUnitAndParseBack) {
  EXPECT_EQ(format_bytes(Bytes{0}), "0");
  EXPECT_EQ(format_bytes(Bytes{1610612736}), "1536MiB");
  EXPECT_EQ(format_bytes(Bytes{1500}), "1500");
  EXPECT_EQ(format_bytes(Bytes{2000}), "2KB");
  EXPECT_EQ(format_bytes(Bytes{1234}), "1234");
  for (const uint64_t value : {1ull, 1023ull, 4096ull, 1000000ull, 3ull << 40, 18446744073709551615ull})
    EXPECT_EQ(parse_bytes(format_bytes(Bytes{value})).value, value) << format_bytes(Bytes{value});
}

TEST(DeckUnits, DurationsAcceptSecondsMillisecondsMinutesHours) {
  EXPECT_DOUBLE_EQ(parse_seconds("30").value, 30);
  EXPECT_DOUBLE_EQ(parse_seconds("30s").value, 30);
  EXPECT_DOUBLE_EQ(parse_seconds("250ms").value, 0.25);
  EXPECT_DOUBLE_EQ(parse_seconds("5min").value, 300);
  EXPECT_DOUBLE_EQ(parse_seconds("2h").value, 7200);
  EXPECT_DOUBLE_EQ(parse_seconds("1.5 H").value, 5400);
  EXPECT_EQ(format_seconds(Seconds{0.25}), "0.25s");
  EXPECT_EQ(parse_seconds(format_seconds(Seconds{0.1})).value, 0.1);

  const std::string unit = parse_error(parse_seconds_only, "5d");
  EXPECT_NE(unit.find("unknown unit 'd'"), std::string::npos) << unit;
  EXPECT_NE(unit.find("ms, s, min, h"), std::string::npos) << unit;
  EXPECT_NE(parse_error(parse_seconds_only, "soon").find("expected a duration"), std::string::npos);
  EXPECT_NE(parse_error(parse_seconds_only, "-3s").find("negative"), std::string::npos);
}

TEST(DeckUnits, BoostProgramOptionsParsesThemThroughValidate) {
  namespace po = boost::program_options;
  po::options_description description;
  description.add_options()("pool.size", po::value<Bytes>())("pool.timeout", po::value<Seconds>());
  std::istringstream text("[pool]\nsize = 64MiB\ntimeout = 250ms\n");
  po::variables_map values;
  po::store(po::parse_config_file(text, description), values);
  EXPECT_EQ(values["pool.size"].as<Bytes>().value, 64u << 20);
  EXPECT_DOUBLE_EQ(values["pool.timeout"].as<Seconds>().value, 0.25);

  std::istringstream bad("[pool]\nsize = 64QB\n");
  po::variables_map fresh;
  EXPECT_THROW(po::store(po::parse_config_file(bad, description), fresh), std::invalid_argument);
}

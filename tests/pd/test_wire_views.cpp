// The views every received PD message is read through read back what the writers laid out,
// field by field. (A malformed message ends the job through fatal_abort.)
#include <gtest/gtest.h>

#include <vector>

#include "pdtrain/pd/wire.hpp"

namespace pdtrain::wire {
namespace {

TEST(WireViews, RequestViewReadsItsIds) {
  const std::vector<char> m = request_message({7, 3, 42}, {5, 1, 9});
  const RequestView r(m, "test");
  EXPECT_EQ(r.head().version, 7);
  EXPECT_EQ(r.head().ticket, 42);
  ASSERT_EQ(r.n(), 3);
  EXPECT_EQ(r.entry(0), 5);
  EXPECT_EQ(r.entry(2), 9);
}

TEST(WireViews, PushViewAddsItsPayloadBytes) {
  const std::vector<char> m =
      message_with_blocks(PushHeader{4, 2}, {{3, 11, 4, 100, -1}, {8, 12, 4, 28, -1}});
  const PushView p(m, "test");
  EXPECT_EQ(p.head().step, 4);
  EXPECT_EQ(p.entry(1).id, 8);
  EXPECT_EQ(p.entry(1).crc, 12u);
  EXPECT_EQ(p.payload_bytes(), 128);
}

TEST(WireViews, ReplyViewFindsARelayedReplysPayloads) {
  ReplyHeader rh{};
  rh.version = 2;
  rh.n = 2;
  std::vector<char> m = message_with_blocks(rh, {{0, 1, 2, 4, -1}, {1, 2, 2, 8, -1}});
  const std::size_t headers = m.size();
  m.resize(headers + 12);  // the payloads, back to back
  const ReplyView relayed(m, ReplyView::Payloads::following, "test");
  EXPECT_EQ(relayed.header_bytes(), headers);
  EXPECT_EQ(relayed.entry(1).bytes, 8);
  const ReplyView header_only({m.data(), headers}, ReplyView::Payloads::apart, "test");
  EXPECT_EQ(header_only.n(), 2);
  EXPECT_EQ(header_only.head().version, 2);
}

}  // namespace
}  // namespace pdtrain::wire

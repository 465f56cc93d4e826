// Which failed worker the launcher names and which line it quotes (launch::FailureNotes,
// is_error_line, is_secondary_error), from crafted worker output.
#include <gtest/gtest.h>

#include "launch/launch.h"

namespace ciuic::launch {
namespace {

TEST(ErrorLines, CiuicErrorsAndTerminateMessagesAreErrorLines) {
  EXPECT_TRUE(is_error_line("ciuic[3] error: out of memory"));
  EXPECT_TRUE(is_error_line("ciuic error: no recipe"));
  EXPECT_TRUE(is_error_line("ciuic-run: error: comm gloo: all_reduce failed"));
  EXPECT_TRUE(is_error_line("terminate called after throwing an instance of 'c10::Error'"));
  EXPECT_TRUE(is_error_line("  what():  CUDA error: an illegal memory access"));
  EXPECT_FALSE(is_error_line("ciuic[3] info: step 3/10 | loss 2.5"));
  EXPECT_FALSE(is_error_line("ciuic[3] warning: an error rate of 3%"));
  EXPECT_FALSE(is_error_line("error: not a ciuic line"));
}

TEST(ErrorLines, ConsequencesOfAnotherFailureAreSecondary) {
  EXPECT_TRUE(is_secondary_error(
      "ciuic-run: error: comm gloo: reduce_scatter(sum) of 788992 bytes on rank 0 (timeout 600 s) "
      "failed: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by "
      "peer "
      "[127.0.0.1]:14250"));
  EXPECT_TRUE(is_secondary_error(
      "ciuic[1] error: ... Read error [10.0.0.2]:3321: Connection reset by peer"));
  EXPECT_TRUE(is_secondary_error("ciuic[1] error: ... Write error: Broken pipe"));
  EXPECT_TRUE(is_secondary_error(
      "ciuic[2] error: NCCL error: remote process exited or there was a network error"));
  EXPECT_TRUE(
      is_secondary_error("ciuic[0] error: rendezvous at 10.0.0.1:29500 timed out after 600 s"));
  EXPECT_FALSE(is_secondary_error("ciuic[1] error: rank 1 ran out of memory on cuda:1"));
  EXPECT_FALSE(is_secondary_error("ciuic[1] error: step 7: the loss is NaN"));
}

TEST(FailureNotes, NothingFailedNamesNothing) {
  FailureNotes n;
  n.line(0, "ciuic[0] error: logged but the rank went on", true);
  EXPECT_FALSE(n.pick().has_value());
}

// The old "last error" quoted a rank's last error line, or else its last stderr line, which was
// often an info line.
TEST(FailureNotes, FirstErrorLineOfARankIsQuoted) {
  FailureNotes n;
  n.line(1, "ciuic[1] info: loading", true);
  n.line(1, "ciuic[1] error: the cause", true);
  n.line(1, "ciuic[1] error: a consequence of it", true);
  n.line(1, "ciuic[1] info: writing the report", true);
  n.failed(1);
  auto p = n.pick();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, 1);
  EXPECT_EQ(p->quote, "ciuic[1] error: the cause");
  EXPECT_TRUE(p->error_line);
  EXPECT_FALSE(p->secondary);
}

TEST(FailureNotes, InfoWarningProgressAndBacktraceLinesAreNeverQuoted) {
  FailureNotes n;
  n.line(2, "Segmentation fault in the data loader thread", true);
  n.line(2, "ciuic[2] info: step 3/10 | loss 2.5 | 9.1k tok/s", true);
  n.line(2, "ciuic[2] warning: slow disk", true);
  n.line(2, "[W1201 04:42:24.084379125 socket.cpp:469] [c10d] waitForInput timed out", true);
  n.line(2, "Exception raised from recvBytes at Utils.hpp:682 (most recent call first):", true);
  n.line(2, "frame #0: c10::Error::Error(...) + 0x9d", true);
  n.line(2, "\033[2Kstep 4/10", true);
  n.line(2, "", true);
  n.line(2, "a line on stdout", false);
  n.failed(2);
  auto p = n.pick();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->quote, "Segmentation fault in the data loader thread");
  EXPECT_FALSE(p->error_line);

  FailureNotes quiet;
  quiet.line(0, "ciuic[0] info: data cache: reusing /tmp/cache", true);
  quiet.failed(0);
  ASSERT_TRUE(quiet.pick());
  EXPECT_EQ(quiet.pick()->quote, "");
}

TEST(FailureNotes, TerminateGetsItsWhat) {
  FailureNotes n;
  n.line(0, "terminate called after throwing an instance of 'c10::Error'", true);
  n.line(0, "  what():  CUDA error: an illegal memory access was encountered", true);
  n.failed(0);
  EXPECT_EQ(n.pick()->quote,
            "terminate called after throwing an instance of 'c10::Error': what():  CUDA error: an "
            "illegal memory access was encountered");
}

// Across ranks: the error that came first, whatever the ranks' numbers or the order of their
// exits.
TEST(FailureNotes, FirstErrorAcrossRanksByArrival) {
  FailureNotes n;
  n.line(3, "ciuic[3] error: disk full writing the checkpoint", true);
  n.line(1, "ciuic[1] error: checkpoint assembly failed: rank 3 reported an error", true);
  n.failed(1);  // reaped first, and a lower rank
  n.failed(3);
  EXPECT_EQ(n.pick()->rank, 3);
  EXPECT_EQ(n.pick()->quote, "ciuic[3] error: disk full writing the checkpoint");
}

// A peer's lost connection is passed over for a later error that is not a consequence: a rank that
// throws closes its connections while unwinding and prints its error only afterwards.
TEST(FailureNotes, ConsequencesArePassedOverForTheCause) {
  FailureNotes n;
  n.line(0,
         "ciuic-run: error: comm gloo: all_gather failed: Connection closed by peer [127.0.0.1]:1",
         true);
  n.failed(0);
  EXPECT_EQ(n.pick()->rank, 0);
  EXPECT_TRUE(n.pick()->secondary);
  n.line(2, "ciuic[2] info: evaluating", true);
  n.line(2, "ciuic[2] error: the loss is NaN at step 7", true);
  n.line(1, "ciuic-run: error: comm gloo: broadcast failed: Connection reset by peer", true);
  n.failed(1);
  n.failed(2);
  EXPECT_EQ(n.pick()->rank, 2);
  EXPECT_EQ(n.pick()->quote, "ciuic[2] error: the loss is NaN at step 7");
  EXPECT_FALSE(n.pick()->secondary);

  // When every error is a consequence, the first one is named.
  FailureNotes all;
  all.line(1, "ciuic[1] error: Connection reset by peer", true);
  all.line(0, "ciuic[0] error: Broken pipe", true);
  all.failed(0);
  all.failed(1);
  EXPECT_EQ(all.pick()->rank, 1);
}

// A rank killed without a word (SIGKILL, a crash) is the cause rather than its peers' lost
// connections.
TEST(FailureNotes, ASilentFailureIsNotAConsequence) {
  FailureNotes n;
  n.line(0, "ciuic[0] error: ... Connection reset by peer", true);
  n.failed(0);
  n.failed(1);  // printed nothing
  EXPECT_EQ(n.pick()->rank, 1);
  EXPECT_EQ(n.pick()->quote, "");
}

}  // namespace
}  // namespace ciuic::launch

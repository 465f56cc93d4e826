// Shared by the launcher tests of lost nodes (test_launch.cpp with test workers,
// nodes_e2e_test.cpp with ciuic-run): the launcher's final line, and the kill of node 1's
// launcher checked from node 0.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "subprocess.h"

namespace ciuic::testing {

// The final line of a launcher's stderr ("ciuic error: launcher: ...").
inline std::string last_line(const std::string& err) {
  const size_t end = err.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t nl = err.rfind('\n', end);
  const size_t begin = nl == std::string::npos ? 0 : nl + 1;
  return err.substr(begin, end + 1 - begin);
}

// kill -9 of node 1's launcher: node 0's launcher exits with 1 within 10 s (waiting up to
// `wait`), and its last line names node 1 as lost, never quoting `secondary` (the peers' lost
// connection).
inline void kill_node1_expect_node0_names_it(Child& c0, Child& c1, std::chrono::milliseconds wait,
                                             const std::string& secondary) {
  const auto killed = std::chrono::steady_clock::now();
  kill(c1.pid(), SIGKILL);
  ASSERT_TRUE(c0.wait(wait)) << c0.err();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  printf("node 0 stopped %.1f s after the kill of node 1's launcher\n", s);
  EXPECT_LT(s, 10.0) << c0.err();
  EXPECT_EQ(c0.exit_code(), 1) << c0.err();
  const std::string last = last_line(c0.err());
  EXPECT_NE(last.find("launcher: stopped because node 1 ("), std::string::npos) << c0.err();
  EXPECT_NE(last.find(" was lost: its launcher sent no heartbeat"), std::string::npos) << c0.err();
  EXPECT_EQ(last.find(secondary), std::string::npos) << c0.err();
}

}  // namespace ciuic::testing

// The gloo comm plugin across processes: the test binary re-executes itself as the workers of a
// run started by ciuic_test_launch (the launcher), at world sizes 2, 3 and 4 (the latter as two
// "nodes" of two on 127.0.0.1). Each worker runs every collective on several dtypes, sizes and
// reduce ops and compares with references computed independently from all ranks' inputs with
// ATen (tests/plugins/comm/comm_test_util.h). In-process tests cover world 1 and argument errors.
#include <ciuic/error.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "../../launch/subprocess.h"
#include "comm_test_util.h"
#include "launch/launch.h"

namespace ciuic {
namespace {

using namespace std::chrono_literals;
using testing::Checker;

const char* kOptions = "interface = \"\"\nhostname = \"\"\nthreads = 2\n";

// ---- worker side ----------------------------------------------------------------------------

void check_collectives(Comm& comm, Checker& c) {
  const int R = comm.rank(), W = comm.size();
  testing::Tally tally;
  testing::Sweep sweep;
  sweep.dtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong};
  sweep.big_dtypes = {at::kFloat, at::kBFloat16};
  sweep.big_numel = int64_t{1} << 16;
  sweep.reduce_scatter_chunks = {7, 16411};
  sweep.all_gather_chunks = {5, 8191};
  testing::check_sweep(comm, c, sweep, c10::Device(c10::kCPU), tally);

  // Several collectives in flight at once, waited in reverse order.
  {
    std::vector<at::Tensor> ts;
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 6; ++k) {
      ts.push_back(testing::rank_input(R, 4096 + k, at::kFloat, true, 100 + k));
      tally.count(ts.back());
      works.push_back(comm.all_reduce(ts.back(), ReduceOp::kSum));
    }
    for (int k = 5; k >= 0; --k) {
      works[k]->wait();
      c.expect(works[k]->is_completed(), "is_completed() after wait()");
      c.close(ts[k], testing::all_inputs(W, 4096 + k, at::kFloat, true, 100 + k).sum(0), 0.0,
              "overlapping all_reduce " + std::to_string(k));
    }
  }

  tally.check(comm, c);
}

int worker_main(const std::string& scenario) {
  auto env = launch::detect_worker_env();
  if (!env) throw Error("comm test worker started without a launcher");
  set_log_rank(env->rank);
  if (scenario == "collectives") {
    RunContext ctx = testing::worker_context(*env, 60s, c10::Device(c10::kCPU));
    auto comm = testing::make_comm("gloo", kOptions, ctx);
    Checker c(env->rank);
    c.expect(comm->rank() == env->rank && comm->size() == env->world_size, "rank()/size()");
    c.expect(comm->backend_name() == "gloo", "backend_name()");
    check_collectives(*comm, c);
    // barrier: every rank writes a key, then passes the barrier, then must see every key.
    ctx.store->set("before-barrier/" + std::to_string(env->rank), "1");
    comm->barrier();
    for (int r = 0; r < env->world_size; ++r)
      c.expect(ctx.store->check("before-barrier/" + std::to_string(r)),
               "passed the barrier before rank " + std::to_string(r) + " reached it");
    comm->barrier();  // nobody leaves (closing its connections) while others still check
    printf("rank %d: %d checks, %d failures\n", env->rank, c.checks(), c.failures());
    return c.failures() == 0 ? 0 : 1;
  }
  if (scenario == "timeout") {
    // Rank 1 never joins the all_reduce: rank 0's wait() must fail after the 2 s timeout with a
    // message naming the collective, instead of hanging.
    RunContext ctx = testing::worker_context(*env, 2s, c10::Device(c10::kCPU));
    auto comm = testing::make_comm("gloo", kOptions, ctx);
    if (env->rank == 1) {  // stay connected until rank 0 has seen its timeout
      for (int i = 0; i < 400 && !ctx.store->check("rank0-done"); ++i)
        std::this_thread::sleep_for(50ms);
      return 0;
    }
    at::Tensor t = at::ones({4}, at::kFloat);
    auto start = std::chrono::steady_clock::now();
    int rc = 1;
    try {
      comm->all_reduce(t, ReduceOp::kSum)->wait();
      log_error("all_reduce without the peer returned normally");
    } catch (const Error& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string m = e.what();
      printf("timeout error after %.1f s: %s\n", s, m.c_str());
      if (m.find("comm gloo: all_reduce(sum) of 16 bytes on rank 0 (timeout 2 s) failed") == 0 &&
          s < 10)
        rc = 0;
      else
        log_error("unexpected timeout error: " + m);
    }
    ctx.store->set("rank0-done", "1");
    return rc;
  }
  throw UsageError("unknown scenario " + scenario);
}

// ---- test side ------------------------------------------------------------------------------

const std::string kLauncher = std::string(CIUIC_BIN_DIR) + "/ciuic_test_launch";

std::unique_ptr<testing::Child> start(const std::vector<std::string>& launcher_args,
                                      const std::string& scenario, const std::string& out) {
  std::vector<std::string> argv{kLauncher};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.insert(argv.end(), {"--", testing::self_exe(), "--comm-worker", scenario});
  return std::make_unique<testing::Child>(argv, out);
}

void run_world(int nproc, int nnodes, const std::string& scenario) {
  const std::string dir =
      testing::fresh_dir("comm-gloo-" + scenario + "-" + std::to_string(nproc * nnodes));
  const std::string port = std::to_string(testing::free_port());
  std::vector<std::unique_ptr<testing::Child>> launchers;
  for (int node = 0; node < nnodes; ++node)
    launchers.push_back(
        start({"--nproc", std::to_string(nproc), "--nnodes", std::to_string(nnodes), "--node-rank",
               std::to_string(node), "--master-port", port, "--all", "--grace", "2"},
              scenario, dir + "/node" + std::to_string(node)));
  for (int node = 0; node < nnodes; ++node) {
    auto& l = *launchers[node];
    ASSERT_TRUE(l.wait(120s)) << "node " << node << " did not finish";
    EXPECT_EQ(l.exit_code(), 0) << "node " << node << ":\n" << l.out() << l.err();
    for (int lr = 0; lr < nproc; ++lr) {
      const int rank = node * nproc + lr;
      if (scenario == "collectives")
        EXPECT_NE(
            l.out().find("[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) + ": "),
            std::string::npos)
            << l.out();
    }
  }
}

TEST(CommGloo, CollectivesMatchReferenceAtWorld2) { run_world(2, 1, "collectives"); }
TEST(CommGloo, CollectivesMatchReferenceAtWorld3) { run_world(3, 1, "collectives"); }
TEST(CommGloo, CollectivesMatchReferenceAtWorld4OnTwoNodes) { run_world(2, 2, "collectives"); }
TEST(CommGloo, MissingPeerTimesOutWithAClearError) { run_world(2, 1, "timeout"); }

class CommGlooSingle : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_.store = make_local_store(5s);
    ctx_.timeout = 5s;
    comm_ = testing::make_comm("gloo", kOptions, ctx_);
  }
  template <class F>
  std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  RunContext ctx_;
  std::shared_ptr<Comm> comm_;
};

TEST_F(CommGlooSingle, WorldOfOneKeepsValuesAndCountsBytes) {
  at::Tensor t = at::arange(10, at::kFloat);
  comm_->all_reduce(t, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(t.equal(at::arange(10, at::kFloat)));
  at::Tensor out = at::empty({10}, at::kFloat);
  comm_->all_gather(out, t)->wait();
  EXPECT_TRUE(out.equal(t));
  comm_->barrier();
  EXPECT_EQ(comm_->counters().calls, 3u);
  EXPECT_EQ(comm_->counters().bytes, 80u);
  // The core reports counters() as comm_calls/comm_bytes/comm_busy_s (TrainE2E checks them in
  // metrics.jsonl); the plugin adds nothing of its own.
  Metrics m;
  comm_->append_metrics(m);
  EXPECT_TRUE(m.values.empty());
}

TEST_F(CommGlooSingle, BadArgumentsAreNamed) {
  at::Tensor in = at::zeros({10}, at::kFloat), out = at::zeros({3}, at::kFloat);
  EXPECT_NE(error_of([&] {
              comm_->reduce_scatter(out, in, ReduceOp::kSum);
            }).find("reduce_scatter: input has 10 elements, expected size() * output.numel() = 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              comm_->all_gather(out, in);
            }).find("all_gather: output has 3 elements, expected size() * input.numel() = 10"),
            std::string::npos);
  at::Tensor ints = at::zeros({4}, at::kInt);
  EXPECT_NE(error_of([&] {
              comm_->all_reduce(ints, ReduceOp::kAvg);
            }).find("avg needs a floating-point tensor, got Int"),
            std::string::npos);
  at::Tensor strided = at::zeros({4, 4}, at::kFloat).t();
  EXPECT_NE(error_of([&] {
              comm_->all_reduce(strided, ReduceOp::kSum);
            }).find("all_reduce: tensor is not contiguous"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { comm_->broadcast(in, 1); }).find("broadcast: root 1 is not a rank of 0..0"),
      std::string::npos);
  at::Tensor d = at::zeros({3}, at::kDouble);
  EXPECT_NE(
      error_of([&] { comm_->all_gather(d, out); }).find("output is Double but input is Float"),
      std::string::npos);
}

TEST(CommGlooContext, RefusesCudaDevice) {
  RunContext ctx;
  ctx.store = make_local_store(1s);
  ctx.device = c10::Device(c10::kCUDA, 0);
  try {
    testing::make_comm("gloo", kOptions, ctx);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("comm gloo works on CPU tensors; the run's device is cuda:0"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ciuic

int main(int argc, char** argv) {
  return ciuic::testing::main_or_worker(
      argc, argv, [](const std::vector<std::string>& a) { return ciuic::worker_main(a.at(0)); },
      [](int n, char** v) {
        ::testing::InitGoogleTest(&n, v);
        return RUN_ALL_TESTS();
      });
}

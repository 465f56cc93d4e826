// The nccl comm plugin on 2 GPUs (label gpu; skipped without 2 CUDA devices): the test binary
// re-executes itself as two workers (one per GPU) under ciuic_test_launch, once per transport
// (auto, nvlink, pcie, shm). Each worker checks every collective on fp32/bf16/fp16 (and fp64,
// int32) against references computed on the CPU with ATen from all ranks' inputs
// (comm_test_util.h), the ordering of collectives against the compute stream, early release of
// tensors (caching-allocator safety), counters, and that a missing peer ends in a clear error
// after the timeout (watchdog + ncclCommAbort) instead of a hang.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
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

// cuda:<local rank>, made current.
c10::Device cuda_device(const launch::WorkerEnv& env) {
  const auto index = static_cast<c10::DeviceIndex>(env.local_rank);
  c10::cuda::set_device(index);
  return c10::Device(c10::kCUDA, index);
}

void check_collectives(Comm& comm, Checker& c) {
  const int R = comm.rank(), W = comm.size();
  const auto dev = comm.device();
  testing::Tally tally;
  testing::Sweep sweep;
  sweep.dtypes = {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kInt};
  sweep.big_dtypes = {at::kFloat, at::kBFloat16, at::kHalf};
  sweep.big_numel = int64_t{1} << 22;
  sweep.reduce_scatter_chunks = {7, int64_t{1} << 20};
  sweep.all_gather_chunks = {5, int64_t{1} << 20};
  testing::check_sweep(comm, c, sweep, dev, tally);

  // Ordering against the compute stream: the input is produced by a long chain of kernels on the
  // current stream right before the collective, and consumed right after wait() — no host syncs.
  {
    const int64_t n = 1 << 24;
    at::Tensor base = testing::rank_input(R, n, at::kFloat, true, 77).to(dev);
    at::Tensor t = at::zeros({n}, base.options());
    for (int k = 0; k < 50; ++k) t.add_(base);  // t = 50 * base, queued asynchronously
    tally.count(t);
    auto w = comm.all_reduce(t, ReduceOp::kSum);
    w->wait();
    t.mul_(0.5);  // ordered after the collective by wait()
    at::Tensor want = testing::all_inputs(W, n, at::kFloat, true, 77).sum(0) * 25.0;
    c.close(t, want, 0.0, "all_reduce ordered after 50 queued kernels and before a consumer");
  }

  // Tensors dropped before the collective completes: their memory must not be reused early.
  {
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      at::Tensor tmp = at::full({1 << 22}, static_cast<float>(R + 1), at::TensorOptions(dev));
      tally.count(tmp);
      works.push_back(comm.all_reduce(tmp, ReduceOp::kSum));
    }  // tmp released here, collectives possibly still running
    at::Tensor keep = at::full({1 << 22}, static_cast<float>(R + 1), at::TensorOptions(dev));
    tally.count(keep);
    auto wk = comm.all_reduce(keep, ReduceOp::kSum);
    at::Tensor scribble = at::full({8 << 22}, -1.0f, at::TensorOptions(dev));  // may reuse memory
    wk->wait();
    for (auto& w : works) w->wait();
    c.close(keep, at::full({1 << 22}, W * (W + 1) / 2.0, at::kDouble), 0.0,
            "all_reduce next to early-released tensors");
  }

  c10::cuda::device_synchronize();  // busy time is read from completed timing events
  tally.check(comm, c);
}

int worker_main(const std::string& scenario, const std::string& transport) {
  auto env = launch::detect_worker_env();
  if (!env) throw Error("comm test worker started without a launcher");
  set_log_rank(env->rank);
  const std::string options = "transport = \"" + transport + "\"\n";
  if (scenario == "collectives") {
    RunContext ctx = testing::worker_context(*env, 120s, cuda_device(*env));
    auto comm = testing::make_comm("nccl", options, ctx);
    Checker c(env->rank);
    c.expect(comm->backend_name() == "nccl", "backend_name()");
    check_collectives(*comm, c);
    comm->barrier();
    printf("rank %d (%s): %d checks, %d failures\n", env->rank, transport.c_str(), c.checks(),
           c.failures());
    return c.failures() == 0 ? 0 : 1;
  }
  if (scenario == "timeout") {
    RunContext ctx = testing::worker_context(*env, 3s, cuda_device(*env));
    auto comm = testing::make_comm("nccl", options, ctx);
    if (env->rank == 1) {  // never joins; stays alive until rank 0 has seen the abort
      for (int i = 0; i < 600 && !ctx.store->check("rank0-done"); ++i)
        std::this_thread::sleep_for(50ms);
      return 0;
    }
    at::Tensor t = at::ones({4}, at::TensorOptions(ctx.device));
    auto start = std::chrono::steady_clock::now();
    int rc = 1;
    try {
      comm->all_reduce(t, ReduceOp::kSum)->wait();
      comm->barrier();  // blocks the host until the watchdog aborts the communicator
      log_error("collectives without the peer returned normally");
    } catch (const Error& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string m = e.what();
      printf("timeout error after %.1f s: %s\n", s, m.c_str());
      if (m.find("comm nccl: all_reduce(sum) of 16 bytes on rank 0 did not complete within 3 s") ==
              0 &&
          s < 15)
        rc = 0;
      else
        log_error("unexpected timeout error: " + m);
    }
    ctx.store->set("rank0-done", "1");
    return rc;
  }
  throw UsageError("unknown scenario " + scenario);
}

void run_pair(const std::string& scenario, const std::string& transport) {
  if (c10::cuda::device_count() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices, found " << int(c10::cuda::device_count());
  const std::string dir = testing::fresh_dir("comm-nccl-" + scenario + "-" + transport);
  testing::Child l(
      {std::string(CIUIC_BIN_DIR) + "/ciuic_test_launch", "--nproc", "2", "--all", "--grace", "5",
       "--", testing::self_exe(), "--comm-worker", scenario, transport},
      dir + "/launch");
  ASSERT_TRUE(l.wait(300s)) << "did not finish";
  EXPECT_EQ(l.exit_code(), 0) << l.out() << l.err();
  std::cout << l.out();
}

TEST(CommNccl, CollectivesMatchReferenceTransportAuto) { run_pair("collectives", "auto"); }
TEST(CommNccl, CollectivesMatchReferenceTransportNvlink) { run_pair("collectives", "nvlink"); }
TEST(CommNccl, CollectivesMatchReferenceTransportPcie) { run_pair("collectives", "pcie"); }
TEST(CommNccl, CollectivesMatchReferenceTransportShm) { run_pair("collectives", "shm"); }
TEST(CommNccl, MissingPeerAbortsWithAClearError) { run_pair("timeout", "auto"); }

TEST(CommNcclContext, RefusesCpuDevice) {
  RunContext ctx;
  ctx.store = make_local_store(1s);
  try {
    testing::make_comm("nccl", "transport = \"auto\"\n", ctx);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm nccl needs CUDA tensors; the run's device is cpu"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ciuic

int main(int argc, char** argv) {
  return ciuic::testing::main_or_worker(
      argc, argv,
      [](const std::vector<std::string>& a) { return ciuic::worker_main(a.at(0), a.at(1)); },
      [](int n, char** v) {
        ::testing::InitGoogleTest(&n, v);
        return RUN_ALL_TESTS();
      });
}

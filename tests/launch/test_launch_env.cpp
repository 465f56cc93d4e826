// Unit tests of the launcher's pure parts: worker environment detection for each launcher (the
// expected values are written out by hand from each launcher's documented variables), SLURM node
// list / tasks-per-node parsing, error-line classification, and the memory helpers on CPU builds.
#include <ciuic/error.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "launch/launch.h"

namespace ciuic::launch {
namespace {

std::optional<WorkerEnv> detect(const std::map<std::string, std::string>& vars) {
  return detect_worker_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string usage_error(const std::map<std::string, std::string>& vars) {
  try {
    detect(vars);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DetectWorkerEnv, NothingSetMeansNoLauncher) { EXPECT_FALSE(detect({}).has_value()); }

TEST(DetectWorkerEnv, Torchrun) {
  auto e = detect({{"RANK", "5"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"GROUP_RANK", "1"},
                   {"MASTER_ADDR", "node-a"},
                   {"MASTER_PORT", "29400"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_RESTART_COUNT", "2"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->launcher, "torchrun");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 4);
  EXPECT_EQ(e->node_rank, 1);
  EXPECT_EQ(e->num_nodes, 2);
  EXPECT_EQ(e->master_addr, "node-a");
  EXPECT_EQ(e->master_port, 29400);
  EXPECT_TRUE(e->store_hosted_by_launcher);
  EXPECT_EQ(e->restart_count, 2);
}

TEST(DetectWorkerEnv, TorchrunWithoutAgentStoreAndGroupRank) {
  auto e = detect({{"RANK", "3"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.1"},
                   {"MASTER_PORT", "1234"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->store_hosted_by_launcher);
  EXPECT_EQ(e->node_rank, 1);  // RANK / LOCAL_WORLD_SIZE
  EXPECT_EQ(e->num_nodes, 2);
}

TEST(DetectWorkerEnv, OursTakesPrecedenceOverSlurm) {
  auto e = detect({{"CIUIC_LAUNCHER", "1"},
                   {"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"GROUP_RANK", "0"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "40000"},
                   {"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "1"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->launcher, "ciuic");
  EXPECT_TRUE(e->store_hosted_by_launcher);
  EXPECT_EQ(e->rank, 1);
}

TEST(DetectWorkerEnv, TorchrunErrorsNameTheVariable) {
  EXPECT_NE(
      usage_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})
          .find("LOCAL_RANK is not set"),
      std::string::npos);
  EXPECT_NE(usage_error({{"RANK", "2"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "0"},
                         {"LOCAL_WORLD_SIZE", "1"},
                         {"MASTER_ADDR", "a"},
                         {"MASTER_PORT", "1"}})
                .find("rank 2 is not below the world size 2"),
            std::string::npos);
  EXPECT_NE(
      usage_error({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}).find("RANK=\"x1\" is not an integer"),
      std::string::npos);
  EXPECT_NE(
      usage_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}})
          .find("MASTER_ADDR is not set"),
      std::string::npos);
  EXPECT_NE(usage_error({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "0"},
                         {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "a"}})
                .find("MASTER_PORT is not set"),
            std::string::npos);
}

TEST(DetectWorkerEnv, SlurmTwoNodes) {
  auto e = detect({{"SLURM_PROCID", "5"},
                   {"SLURM_NTASKS", "7"},
                   {"SLURM_LOCALID", "1"},
                   {"SLURM_NODEID", "1"},
                   {"SLURM_NNODES", "2"},
                   {"SLURM_STEP_TASKS_PER_NODE", "4,3"},
                   {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                   {"SLURM_JOB_ID", "123456"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->launcher, "slurm");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 7);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 3);
  EXPECT_EQ(e->node_rank, 1);
  EXPECT_EQ(e->num_nodes, 2);
  EXPECT_EQ(e->master_addr, "gpu07");
  EXPECT_EQ(e->master_port, 15000 + 3456);
  EXPECT_FALSE(e->store_hosted_by_launcher);
}

TEST(DetectWorkerEnv, SlurmMasterFromEnvironment) {
  auto e = detect({{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "4"},
                   {"SLURM_LOCALID", "0"},
                   {"SLURM_NODEID", "0"},
                   {"SLURM_NNODES", "2"},
                   {"SLURM_TASKS_PER_NODE", "2(x2)"},
                   {"SLURM_JOB_NODELIST", "weird[1-2]x[3-4]"},
                   {"MASTER_ADDR", "head"},
                   {"MASTER_PORT", "29555"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->master_addr, "head");
  EXPECT_EQ(e->master_port, 29555);
  EXPECT_EQ(e->local_world_size, 2);
}

TEST(DetectWorkerEnv, SlurmSingleTaskIsNotAWorker) {
  EXPECT_FALSE(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).has_value());
}

TEST(DetectWorkerEnv, SlurmUnreadableNodeListAsksForMasterAddr) {
  std::string m = usage_error({{"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "4"},
                               {"SLURM_LOCALID", "0"},
                               {"SLURM_NODEID", "0"},
                               {"SLURM_NNODES", "2"},
                               {"SLURM_JOB_NODELIST", "a[1-2]b[3-4]"}});
  EXPECT_NE(m.find("MASTER_ADDR is not set and the first host could not be read from "
                   "SLURM_JOB_NODELIST=\"a[1-2]b[3-4]\""),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("scontrol show hostnames"), std::string::npos) << m;
}

TEST(DetectWorkerEnv, OpenMpi) {
  auto e = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"MASTER_ADDR", "n0"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->launcher, "mpirun");
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->node_rank, 1);
  EXPECT_EQ(e->num_nodes, 2);
  EXPECT_EQ(e->master_addr, "n0");
  EXPECT_EQ(e->master_port, 29500);
}

TEST(DetectWorkerEnv, OpenMpiOneNodeNeedsNoMasterAddr) {
  auto e = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->master_addr, "127.0.0.1");
  EXPECT_NE(usage_error({{"OMPI_COMM_WORLD_RANK", "1"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
}

TEST(DetectWorkerEnv, PmiHydra) {
  auto e = detect({{"PMI_RANK", "2"},
                   {"PMI_SIZE", "3"},
                   {"MPI_LOCALRANKID", "2"},
                   {"MPI_LOCALNRANKS", "3"},
                   {"MASTER_PORT", "31000"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world_size, 3);
  EXPECT_EQ(e->local_rank, 2);
  EXPECT_EQ(e->num_nodes, 1);
  EXPECT_EQ(e->master_port, 31000);
  EXPECT_NE(usage_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}})
                .find("MPI_LOCALRANKID or PMI_LOCAL_RANK is not set"),
            std::string::npos);
}

TEST(SlurmParsing, FirstHost) {
  EXPECT_EQ(first_slurm_host("node01"), "node01");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("gpu[03-05,9],cpu1"), "gpu03");
  EXPECT_EQ(first_slurm_host("gpu[9,3]"), "gpu9");
  EXPECT_EQ(first_slurm_host("rack1-[001-004]-ib"), "rack1-001-ib");
  EXPECT_FALSE(first_slurm_host("a[1-2]b[3-4]"));
  EXPECT_FALSE(first_slurm_host("a[1-2"));
  EXPECT_FALSE(first_slurm_host(""));
  EXPECT_FALSE(first_slurm_host("a[x-y]"));
}

TEST(SlurmParsing, TasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 1), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 2), 3);
  EXPECT_FALSE(slurm_tasks_on_node("4(x2),3", 3));
  EXPECT_FALSE(slurm_tasks_on_node("4(2)", 0));
  EXPECT_FALSE(slurm_tasks_on_node("x", 0));
}

// What a worker takes from OMP_NUM_THREADS (train/run.cpp: else usable cores / ranks per node).
TEST(OmpNumThreads, PositiveCountsAndTheFirstNestedLevelOnly) {
  EXPECT_EQ(parse_omp_num_threads("8"), 8);
  EXPECT_EQ(parse_omp_num_threads(" 4 "), 4);
  EXPECT_EQ(parse_omp_num_threads("4,2"), 4);
  EXPECT_EQ(parse_omp_num_threads("65536"), 65536);
  for (const char* bad : {"", "0", "-1", "abc", "4x", "65537", "99999999999", ",4", "1.5"})
    EXPECT_EQ(parse_omp_num_threads(bad), std::nullopt) << bad;
  EXPECT_EQ(parse_omp_num_threads(nullptr), std::nullopt);
  EXPECT_GE(usable_cores(), 1);
}

TEST(ErrorLines, Classification) {
  EXPECT_TRUE(is_error_line("ciuic[3] error: out of memory"));
  EXPECT_TRUE(is_error_line("ciuic error: bad recipe"));
  EXPECT_TRUE(is_error_line("terminate called after throwing an instance of 'c10::Error'"));
  EXPECT_TRUE(is_error_line("  what():  CUDA error"));
  EXPECT_FALSE(is_error_line("ciuic[3] info: step 10 loss 2.3"));
  EXPECT_FALSE(is_error_line("ciuic[0] warning: error budget"));
  EXPECT_FALSE(is_error_line("step 10: no error: loss 2.3"));
  EXPECT_FALSE(is_error_line(""));
}

#ifndef CIUIC_WITH_CUDA
TEST(MemoryCap, CpuBuildsIgnoreTheCapAndNameRankAndCapOnOom) {
  apply_memory_cap(0, 8.0);  // no CUDA: nothing to cap, no error
  std::string m = out_of_memory_message(3, 0, 8.0, "could not allocate 2 GiB");
  EXPECT_EQ(m, "rank 3 ran out of memory (cap 8.00 GiB): could not allocate 2 GiB");
}
#endif

// Expandable segments unless the user configured the allocator (either variable name).
TEST(AllocatorDefaults, SetOnlyWhenTheUserSetNothing) {
  unsetenv("PYTORCH_ALLOC_CONF");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(apply_allocator_defaults(), "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  ASSERT_NE(std::getenv("PYTORCH_CUDA_ALLOC_CONF"), nullptr);
  EXPECT_STREQ(std::getenv("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:True");

  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128", 1);
  EXPECT_EQ(apply_allocator_defaults(), "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128");
  EXPECT_STREQ(std::getenv("PYTORCH_CUDA_ALLOC_CONF"), "max_split_size_mb:128");

  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False", 1);
  EXPECT_EQ(apply_allocator_defaults(), "PYTORCH_ALLOC_CONF=expandable_segments:False");
  EXPECT_EQ(std::getenv("PYTORCH_CUDA_ALLOC_CONF"), nullptr);
  unsetenv("PYTORCH_ALLOC_CONF");
}

}  // namespace
}  // namespace ciuic::launch

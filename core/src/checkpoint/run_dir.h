// Internal: the run directory — whether a run may start in it, and who may write in it.
// (CIUIC_API: exported for ciuic-run and the tests; not part of the plugin SDK.)
//
// A run writes into two folders: [run] output_dir (the metrics file, the hf/ export) and its
// checkpoint dir ([checkpoint] dir, default <output_dir>/checkpoints). Before any worker builds
// anything, exactly ONE process of the run claims them (claim_run_dir), in this order:
//
//   1. Paths. Each folder must be a folder or creatable: a file (or any non-folder) in its place
//      or in place of one of its parents is a UsageError naming it. output_dir is created.
//   2. Lock. An exclusive flock(2) on <folder>/.ciuic-run.lock in output_dir and in the
//      checkpoint dir (one lock when they are the same folder), held until the claim is
//      destroyed or the process ends, however it ends (the kernel releases flock locks of a
//      crashed or killed process; nothing stale is left to clean up). The file holds the
//      holder's pid, host and start time; a second run is refused (Error) with those. The lock
//      file stays in the folder after the run (harmless; deleting it while a run is active
//      would let a second run in). On a filesystem without flock support (ENOLCK, EOPNOTSUPP,
//      ENOSYS: NFS without a lock manager, Lustre mounted without -o flock) the run warns and
//      continues unlocked.
//   3. Another run's files. A run that does not continue the run of these folders (no --resume,
//      or --resume of a checkpoint outside the checkpoint dir) refuses (UsageError) folders that
//      hold another run's files: step_* checkpoint folders in the checkpoint dir, a non-empty
//      metrics file, a non-empty hf/ export. The message names the folder and the choices: --resume
//      latest|auto, another run.output_dir, or --overwrite. With --overwrite those files are
//      MOVED (rename(2), instant on one filesystem; never deleted) into a folder
//      replaced-<YYYYmmdd-HHMMSS> of output_dir — of the checkpoint dir for checkpoints when
//      [checkpoint] dir lies outside output_dir — keeping their relative paths. A typo'd folder
//      or a stray --overwrite in a script therefore never destroys a run; the user deletes the
//      replaced-* folder when sure. The checkpoint dir is created once the checks pass.
//
// Who claims (app/cli.cpp, train/run.cpp build_run):
//   - ciuic-run as its own launcher: the launcher of node 0, before it starts any worker, for the
//     whole run; launchers of other nodes claim nothing (the folders are on a filesystem that
//     every node sees, as checkpoints already require, and one holder per run cannot deadlock
//     with itself). Its workers claim nothing.
//   - a single-process run: that process, before building the run.
//   - workers started by another launcher (torchrun, srun, mpirun): rank 0, right after the
//     rendezvous; the other ranks wait for its verdict through the run's store and fail with the
//     same error, so that no rank hangs or trains when rank 0 refuses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ciuic/context.h>
#include <ciuic/export.h>

namespace ciuic::checkpoint {

// Where a run writes (relative paths are relative to the working directory); the trainer's
// TrainOptions::run_paths() (train/options.h) fills it from the recipe.
struct RunPaths {
  std::string output_dir;      // [run] output_dir
  std::string checkpoint_dir;  // [checkpoint] dir, or <output_dir>/checkpoints when ""
  std::string metrics_file;    // <output_dir>/<[log] metrics_file>
  std::string hf_dir;          // <output_dir>/hf ([checkpoint] export_hf)
};

struct ClaimOptions {
  std::string resume;      // --resume: "" (fresh), latest, auto, or a checkpoint folder
  bool overwrite = false;  // --overwrite: move another run's files aside, then start fresh
};

// True when `resume` continues the run whose files are in `checkpoint_dir`: latest, auto, or a
// folder that is the checkpoint dir or inside it. Such a run may append to its folders; --resume
// of a checkpoint elsewhere starts a new run in them (checked like a fresh one).
CIUIC_API bool resumes_in_place(const std::string& resume, const std::string& checkpoint_dir);

// Name of the lock file in each claimed folder.
inline constexpr const char* kLockFile = ".ciuic-run.lock";
// Prefix of the folders that --overwrite moves a previous run's files into, and its full name
// now: "replaced-<YYYYmmdd-HHMMSS>" (local time).
inline constexpr const char* kReplacedPrefix = "replaced-";
CIUIC_API std::string replaced_name();

class RunDirClaim;

// Steps 1-3 above, in this process. Throws UsageError (a path is a file; another run's files
// without --resume/--overwrite; --overwrite with a --resume that resumes in place) or Error
// (locked by another run; I/O failure), having changed nothing but creating missing folders and
// lock files.
CIUIC_API RunDirClaim claim_run_dir(const RunPaths& paths, const ClaimOptions& options);

// The locks of a claimed run directory; released when destroyed (or when the process ends).
// Move-only. Its file descriptors are close-on-exec: workers the launcher execs do not hold them.
class CIUIC_API RunDirClaim {
 public:
  RunDirClaim() = default;
  RunDirClaim(RunDirClaim&& other) noexcept;
  RunDirClaim& operator=(RunDirClaim&& other) noexcept;
  RunDirClaim(const RunDirClaim&) = delete;
  RunDirClaim& operator=(const RunDirClaim&) = delete;
  ~RunDirClaim();

  // The lock files held (empty when nothing was claimed or locking is unsupported).
  const std::vector<std::string>& lock_files() const { return lock_files_; }
  // The replaced-* folders --overwrite moved the previous run's files into (none: empty).
  const std::vector<std::string>& replaced() const { return replaced_; }
  // Releases the locks now.
  void release();

 private:
  friend RunDirClaim claim_run_dir(const RunPaths&, const ClaimOptions&);
  std::vector<int> fds_;
  std::vector<std::string> lock_files_;
  std::vector<std::string> replaced_;
};

// Collective (every rank of the run, after the rendezvous): rank 0 claims, then publishes its
// verdict in ctx.store; the other ranks wait for it (up to the store's timeout) and throw the same
// error (same exit code) when rank 0 failed. Returns rank 0's claim; an empty one elsewhere.
CIUIC_API RunDirClaim claim_run_dir(const RunPaths& paths, const ClaimOptions& options,
                                    const RunContext& ctx);

}  // namespace ciuic::checkpoint

// ciuic_test_launch: calls launch::launch_and_supervise with options from its command line, so
// that the launcher tests can run it as a separate process (signals, exit codes, output).
//
//   ciuic_test_launch [--nproc N] [--nnodes N] [--node-rank R] [--master-addr A]
//                     [--master-port P] [--all] [--grace S] [--timeout S] -- <worker argv...>
#include <ciuic/error.h>
#include <ciuic/log.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "launch/launch.h"

int main(int argc, char** argv) {
  using namespace ciuic;
  try {
    launch::LaunchOptions o;
    int i = 1;
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(std::string(argv[i]) + " needs a value");
      return argv[++i];
    };
    for (; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--") {
        ++i;
        break;
      }
      if (a == "--nproc")
        o.nproc_per_node = std::stoi(value());
      else if (a == "--nnodes")
        o.nnodes = std::stoi(value());
      else if (a == "--node-rank")
        o.node_rank = std::stoi(value());
      else if (a == "--master-addr")
        o.master_addr = value();
      else if (a == "--master-port")
        o.master_port = std::stoi(value());
      else if (a == "--all")
        o.output_all_ranks = true;
      else if (a == "--grace")
        o.stop_grace = std::chrono::seconds(std::stoi(value()));
      else if (a == "--timeout")
        o.rendezvous_timeout = std::chrono::seconds(std::stoi(value()));
      else
        throw UsageError("unknown option " + a);
    }
    for (; i < argc; ++i) o.argv.push_back(argv[i]);
    // The launchers of one test share its folder, as nodes share the run directory.
    const char* dir = std::getenv("CIUIC_TEST_PIDDIR");
    o.store_token_file = std::string(dir ? dir : ".") + "/store-token";
    return launch::launch_and_supervise(o);
  } catch (const Error& e) {
    log_error(e.what());
    return e.exit_code();
  }
}

// A stand-in for `ktune run` in the launcher tests: as a launcher, it takes
//   launch_test_worker NNODES NPROC NODE_RANK ENDPOINT|standalone MODE
// and launches itself as the workers; as a worker (RANK set), it joins a Gloo group, allreduces
// rank+1 and prints the sum. MODE "ok" succeeds; "fail1" makes rank 1 exit 3 after joining, so the
// others are blocked in a collective that can never finish — the launcher must stop them.
// "fail1_slow_exit" makes rank 1 record its error and close its connections, then linger before
// exiting (recording a second error after its peers' on the way out, as main does after a recipe
// recorded its own): its peers fail (and are reaped) first, as happens when a sanitizer slows an
// exit, and the launcher must still name rank 1's first error as the cause. "slow0" makes rank 0 sleep 6 s before the
// allreduce: its peers wait there for as long as the collectives' timeout (env
// KTUNE_COLLECTIVE_TIMEOUT, read by read_worker_env) lets them. "fail1_records_late" makes rank 1
// close its connections first and record its error only after a peer has recorded its own (a
// lost peer, PeerLostError): the launcher must still name rank 1 as the cause. "killed1" makes rank 1 touch 96 MiB
// and die of a SIGKILL that no one in the job sent, as the kernel's OOM killer ends a process.
// "joined_then_wait" makes every rank say "rank N joined, pid P" on stderr once the group has formed;
// rank 0 then enters the allreduce while rank 1 waits 60 s before it, for a test to kill or interrupt.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/launcher.h"
#include "dist/process_group.h"
#include "dist/worker_error.h"
#include "dist/tcp_store.h"

using namespace ktune::dist;

// Waits (up to 20 s) until another rank of this node has recorded its error (its file sits beside
// this worker's own, TORCHELASTIC_ERROR_FILE, as error_rank<r>.json). One, not all: once a peer has
// exited the launcher stops the others, which may then end before they record anything.
static void wait_for_the_peers_records(const WorkerEnv& env) {
  const char* own = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (own == nullptr) return;
  const std::filesystem::path dir = std::filesystem::path(own).parent_path();
  for (int waited_ms = 0; waited_ms < 20000; waited_ms += 10) {
    for (int r = 0; r < env.world_size; ++r)
      if (r != env.rank && std::filesystem::exists(dir / ("error_rank" + std::to_string(r) + ".json"))) return;
    usleep(10 * 1000);
  }
}

static int worker(const WorkerEnv& env, const std::string& mode) {
  if ((mode == "fail1_slow_exit" || mode == "fail1_records_late") && env.rank == 1) {
    // Rank 1 lingers whatever the launcher sends: SIGTERM blocked before the store's and the group's
    // threads start, since they inherit the mask (blocked later, in this thread only, the signal
    // would be delivered to one of them and end the process before its record).
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, nullptr);
  }
  TcpStore store(env.master_addr, env.master_port, std::chrono::seconds(20));
  auto group = make_gloo_process_group(store, "test", env.rank, env.world_size, local_address_towards(env.master_addr),
                                       env.collective_timeout);
  if ((mode == "fail1" || mode == "fail1_slow_exit") && env.rank == 1) {
    std::fprintf(stderr, "rank 1 failing on purpose\n");
    record_worker_error("rank 1 failing on purpose");
    if (mode == "fail1_slow_exit") {  // SIGTERM blocked (above), so that the second record below happens
      group.reset();  // the peers see the connection close now, fail, and record theirs
      wait_for_the_peers_records(env);
      record_worker_error("rank 1 on its way out");  // later than the peers': the first record stands
      usleep(1000 * 1000);
    }
    return 3;
  }
  if (mode == "fail1_records_late" && env.rank == 1) {  // SIGTERM blocked (above): it must not cut the record short
    group.reset();  // the peers fail in their allreduce and record that first
    wait_for_the_peers_records(env);
    record_worker_error("rank 1 failing on purpose, after its peers recorded theirs");
    return 3;
  }
  if (mode == "killed1" && env.rank == 1) {  // as the OOM killer ends a worker: SIGKILL, after 96 MiB resident
    std::vector<char> memory(96 << 20);
    for (size_t i = 0; i < memory.size(); i += 4096) memory[i] = char(i);
    std::fprintf(stderr, "rank 1 holds %zu bytes\n", memory.size());
    raise(SIGKILL);
  }
  if (mode == "slow0" && env.rank == 0) usleep(6000 * 1000);
  if (mode == "joined_then_wait") {
    std::fprintf(stderr, "rank %d joined, pid %d\n", env.rank, int(getpid()));
    if (env.rank == 1) sleep(60);
  }
  float value = float(env.rank + 1);
  group->allreduce_sum(&value, 1);
  std::printf("rank %d of %d sum %.0f threads %s\n", env.rank, env.world_size, value, std::getenv("KTUNE_NUM_THREADS"));
  return 0;
}

int main(int argc, char** argv) {
  try {
    if (auto env = read_worker_env()) return worker(*env, argc > 1 ? argv[1] : "ok");
    if (argc != 6) {
      std::fprintf(stderr, "usage: %s NNODES NPROC NODE_RANK ENDPOINT|standalone MODE\n", argv[0]);
      return 2;
    }
    LauncherArgs args = {{"nnodes", {argv[1], "--nnodes"}},
                         {"nproc_per_node", {argv[2], "--nproc_per_node"}},
                         {"node_rank", {argv[3], "--node_rank"}}};
    if (std::string(argv[4]) == "standalone")
      args["standalone"] = {"1", "--standalone"};
    else
      args["rdzv_endpoint"] = {argv[4], "--rdzv_endpoint"};
    LaunchPlan plan = resolve_launch_plan(args);
    return run_launcher(plan, {"/proc/self/exe", argv[5]});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    record_worker_error(e.what(), dynamic_cast<const PeerLostError*>(&e) != nullptr);
    return 1;
  }
}

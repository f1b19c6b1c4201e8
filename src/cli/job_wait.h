// How `ktune jobs wait` and `ktune train --wait` end: TrainerClient::wait_for_job_status as an exit
// code, 0 when the job reached a status waited for (done prints it), 1 when it failed, 3 when the wait
// timed out (the SDK's message on stderr). It deliberately leaves the statuses, the timeout and the
// polling interval to the command.
#pragma once

#include <cstdio>
#include <set>
#include <string>

#include "sdk/trainer_client.h"

namespace ktune::cli {

template <typename Done>
int wait_exit_code(sdk::TrainerClient& client, const std::string& job, const std::set<std::string>& statuses,
                   double timeout, double interval, Done done) {
  try {
    done(client.wait_for_job_status(job, statuses, timeout, interval));
    return 0;
  } catch (const sdk::JobFailedError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const sdk::WaitTimeoutError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}

}  // namespace ktune::cli

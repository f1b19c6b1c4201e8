// A stand-in for `ktune jobs supervise …` in the sdk tests, so that they need only the sdk layer
// and not the whole ktune binary (whose CLI tests run the real one). Same code path.
#include <string>
#include <vector>

#include "sdk/local_backend.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2 || args[0] != "jobs" || args[1] != "supervise") return 2;
  return ktune::sdk::supervise_command(std::vector<std::string>(args.begin() + 2, args.end()));
}

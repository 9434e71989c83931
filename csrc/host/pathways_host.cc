// The `pathways-host` executable: see host_main.h.

#include <iostream>
#include <string>
#include <vector>

#include "csrc/host/host_main.h"

int main(int argc, char** argv) {
  auto options = pw::ParseHostArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::cerr << "pathways-host: " << options.status().message() << "\n";
    return 2;
  }
  return pw::RunHost(*options);
}

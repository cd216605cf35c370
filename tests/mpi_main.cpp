// Catch2 main for tests that run under mpirun (tests/mpi_cases): every rank runs every test case
// in the same order, so test cases may use collectives. Use CHECK (not REQUIRE) between
// collectives so a failing rank does not leave the others waiting.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "dist/comm.hpp"

int main(int argc, char** argv) {
  dz::MpiRuntime mpi(&argc, &argv);
  return Catch::Session().run(argc, argv);
}

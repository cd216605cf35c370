// Which transport a group's collectives take (backend/device_comm.hpp): NCCL only on the CUDA
// backend with NCCL built in and every member on its own GPU; ranks sharing a GPU (NCCL refuses
// them) and the CPU backend go through MPI.
#include <catch2/catch.hpp>

#include "backend/device_comm.hpp"

using dz::Transport;

TEST_CASE("device_comm: NCCL for distinct GPUs on the cuda backend, MPI otherwise", "[unit]") {
  const std::vector<std::pair<std::string, int>> distinct{{"n1", 0}, {"n1", 1}, {"n2", 0}, {"n2", 1}};
  const std::vector<std::pair<std::string, int>> shared{{"n1", 0}, {"n1", 1}, {"n1", 0}};
  const std::vector<std::pair<std::string, int>> one{{"n1", 3}};
  CHECK(dz::choose_transport(true, true, distinct) == Transport::Nccl);
  CHECK(dz::choose_transport(true, true, one) == Transport::Nccl);
  CHECK(dz::choose_transport(true, true, shared) == Transport::Mpi);
  CHECK(dz::choose_transport(false, true, distinct) == Transport::Mpi);  // cpu backend
  CHECK(dz::choose_transport(true, false, distinct) == Transport::Mpi);  // built without NCCL
  // the same GPU index on different hosts is distinct
  CHECK(dz::choose_transport(true, true, {{"a", 0}, {"b", 0}}) == Transport::Nccl);
}

TEST_CASE("device_comm: the cpu backend's group of one is MPI and an identity", "[unit]") {
  const dz::Comm self;
  auto dc = dz::make_device_comm(dz::cpu_backend(), self);
  CHECK(dc->kind() == "mpi");
  std::vector<float> v{1.f, -2.f, 3.5f};
  dz::DTensor t = dz::host_view(v.data(), {3});
  dc->allreduce_sum(t);
  CHECK(v == std::vector<float>{1.f, -2.f, 3.5f});
}

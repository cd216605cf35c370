// Helpers for tests that drive the real dayzero binary.
#pragma once
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace dzt {

struct Result {
  int code = -1;
  std::string err;  // stderr
  std::string out;  // stdout
};

inline std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void env_for_mpi() {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("HDF5_USE_FILE_LOCKING", "FALSE", 1);
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
}

// Runs `dayzero ARGS` (under `mpirun -np NP` when np > 0) and captures exit code and output.
inline Result dayzero(const std::string& args, const std::string& workdir, int np = 0) {
  env_for_mpi();
  std::string out = workdir + "/stdout.txt", err = workdir + "/stderr.txt";
  std::string cmd = (np > 0 ? "mpirun -np " + std::to_string(np) + " --oversubscribe " : std::string()) + DZ_EXE +
                    " " + args + " >" + out + " 2>" + err;
  int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Lines of `text` that start with "dayzero: error".
inline int error_lines(const std::string& text) {
  std::istringstream is(text);
  std::string line;
  int n = 0;
  while (std::getline(is, line))
    if (line.rfind("dayzero: error", 0) == 0) ++n;
  return n;
}

inline std::string tmpdir(const std::string& tag) {
  std::string t = "/tmp/dz_cli_" + tag + "_XXXXXX";
  char* d = mkdtemp(&t[0]);
  return d ? std::string(d) : std::string();
}

inline bool exists(const std::string& p) {
  struct stat s;
  return ::stat(p.c_str(), &s) == 0;
}

}  // namespace dzt

// Small RAII wrapper and helpers over the HDF5 C API. Only lib/io/hdf5_io.cpp (and tests) use it.
#pragma once
#include <hdf5.h>

#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace dz::h5 {

// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype, attribute or property
// list) and closes it with the matching H5?close. Never wrap predefined ids (H5T_NATIVE_*).
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.release()) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.release();
    }
    return *this;
  }

  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  hid_t release() {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset() {
    if (id_ >= 0) close_id(id_);
    id_ = H5I_INVALID_HID;
  }

  // Closes any owned id by its type; errors are ignored (used from destructors).
  static void close_id(hid_t id) {
    switch (H5Iget_type(id)) {
      case H5I_FILE: H5Fclose(id); break;
      case H5I_GROUP: H5Gclose(id); break;
      case H5I_DATATYPE: H5Tclose(id); break;
      case H5I_DATASPACE: H5Sclose(id); break;
      case H5I_DATASET: H5Dclose(id); break;
      case H5I_ATTR: H5Aclose(id); break;
      case H5I_GENPROP_LST: H5Pclose(id); break;
      default: break;
    }
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's automatic error-stack printing (we report one-line dz::Errors instead).
// Idempotent; called by every entry point of hdf5_io.
inline void init() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// File access properties: POSIX (sec2) driver, and no HDF5 file locking where the library
// supports switching it off (1.10.7+, 1.12.1+): locks fail on many NFS/Lustre mounts, and our
// own O_EXCL creation of PATH.part already keeps two runs from starting the same output.
// HDF5_USE_FILE_LOCKING in the environment still overrides this.
inline Handle file_access() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  DZ_CHECK(fapl, "HDF5: cannot create a file access property list");
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
  H5Pset_file_locking(fapl.get(), false, true);
#endif
  return fapl;
}

// Dimensions of a dataset's (simple) dataspace.
inline std::vector<hsize_t> dims_of(hid_t dset) {
  Handle space(H5Dget_space(dset));
  int rank = space ? H5Sget_simple_extent_ndims(space.get()) : -1;
  DZ_CHECK(rank >= 0, "HDF5: cannot read a dataspace");
  std::vector<hsize_t> d(size_t(rank), 0);
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
  return d;
}

// "int32", "uint8", "float64", "string", ... for messages.
inline std::string type_name(hid_t type) {
  const size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return str(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", bits);
    case H5T_FLOAT: return str("float", bits);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    default: return "other";
  }
}

// "[10, 5]"
inline std::string shape_str(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace dz::h5

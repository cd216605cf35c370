// Reading a whole 1-D dataset of a test fixture (golden.h5, mtp_ref.h5) into a vector.
#pragma once
#include <catch2/catch.hpp>
#include <hdf5.h>

#include <string>
#include <vector>

namespace dzt {

template <class T>
std::vector<T> read_ds(hid_t f, const std::string& name, hid_t type) {
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  hid_t s = H5Dget_space(d);
  std::vector<T> v(static_cast<size_t>(H5Sget_simple_extent_npoints(s)));
  REQUIRE(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
  H5Sclose(s);
  H5Dclose(d);
  return v;
}

}  // namespace dzt

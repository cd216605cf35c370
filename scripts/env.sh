# Sourced by the scripts: what mpirun needs in containers and as root, and HDF5 on shared FS.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HDF5_USE_FILE_LOCKING=FALSE
# Containers often lack a usable shared-memory transport for vader's CMA; fall back quietly.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1

# Sourced by the scripts: lets Open MPI's mpirun start as root (CI runs as root) and run more
# ranks than cores, as the test and demo machines have two cores.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
# Quiet the "no high-performance network" warning of Open MPI on laptops and VMs.
export OMPI_MCA_btl_base_warn_component_unused=0

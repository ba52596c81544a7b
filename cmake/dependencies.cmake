# Finds LibTorch (from the pinned wheel in .venv), MPI and the Debian libraries,
# and decides whether the CUDA parts are built.

# Torch's CMake would otherwise try to run a GPU-detection program; we build for
# Hopper (sm_90) unless the caller says otherwise.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
if(NOT Torch_DIR AND EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  execute_process(COMMAND ${CMAKE_SOURCE_DIR}/.venv/bin/python -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE)
  list(APPEND CMAKE_PREFIX_PATH ${torch_prefix})
endif()
find_package(Torch REQUIRED)
get_filename_component(COLOSSUS_TORCH_ROOT "${TORCH_INSTALL_PREFIX}" ABSOLUTE)

find_package(MPI REQUIRED COMPONENTS C)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
# toml++ is header-only; machines without Debian's package (the GPU image) get
# its headers through COLOSSUS_EXTRA_INCLUDE (scripts/device_build.sh ships them).
set(COLOSSUS_EXTRA_INCLUDE "" CACHE PATH "Extra include directory for header-only dependencies")
find_path(TOMLPP_INCLUDE_DIR toml++/toml.h HINTS ${COLOSSUS_EXTRA_INCLUDE} REQUIRED)
if(COLOSSUS_TESTS)
  find_package(GTest REQUIRED)
endif()
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# Unicode normalisation of tokenizer.json normalizers (NFC, NFKC, ...).
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# Split pre-tokenizer regexes beyond the hand-written ones (the engine HF tokenizers uses).
pkg_check_modules(ONIGURUMA REQUIRED IMPORTED_TARGET oniguruma)
# cpp-httplib for `colossus serve` (Debian's split build: its pkg-config carries
# the compile definitions the library was built with). Optional: without it
# the server is left out and `colossus serve` says so.
# Machines without the package (the GPU image) may bring upstream's
# header-only httplib.h through COLOSSUS_EXTRA_INCLUDE (scripts/pack_device_deps.sh
# fetches the release Debian packages); a split declarations-only header is not enough.
pkg_check_modules(HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
add_library(colossus_httplib INTERFACE)
if(HTTPLIB_FOUND)
  target_link_libraries(colossus_httplib INTERFACE PkgConfig::HTTPLIB)
else()
  find_path(HTTPLIB_HEADER_DIR httplib.h HINTS ${COLOSSUS_EXTRA_INCLUDE} NO_DEFAULT_PATH)
  if(HTTPLIB_HEADER_DIR)
    file(STRINGS ${HTTPLIB_HEADER_DIR}/httplib.h httplib_definitions LIMIT_COUNT 1 REGEX "^inline Server::Server\\(\\)")
    if(httplib_definitions)
      target_include_directories(colossus_httplib SYSTEM INTERFACE ${HTTPLIB_HEADER_DIR})
      set(HTTPLIB_FOUND ON)
    endif()
  endif()
endif()

set(torch_has_cuda OFF)
if(TARGET torch_cuda)
  set(torch_has_cuda ON)
endif()
if(COLOSSUS_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(torch_has_cuda AND CMAKE_CUDA_COMPILER)
    set(COLOSSUS_WITH_CUDA ON)
  else()
    set(COLOSSUS_WITH_CUDA OFF)
  endif()
elseif(COLOSSUS_CUDA)
  if(NOT torch_has_cuda)
    message(FATAL_ERROR "COLOSSUS_CUDA=ON but the torch at ${COLOSSUS_TORCH_ROOT} has no CUDA; install a CUDA wheel or use -DCOLOSSUS_CUDA=OFF")
  endif()
  set(COLOSSUS_WITH_CUDA ON)
else()
  set(COLOSSUS_WITH_CUDA OFF)
endif()

# The kernels need sm_80 (bf16 mma.sync; no Hopper-only instructions): machine code for
# A100 (80), A10/RTX 30x0 (86), L4/L40S/RTX 40x0 (89) and Hopper (90), plus
# compute_90 PTX for later GPUs to JIT. -DCOLOSSUS_CUDA_ARCHS narrows it
# (scripts/device_build.sh builds 90 only; "80-virtual" alone is PTX for the
# JIT test).
set(COLOSSUS_CUDA_ARCHS "80-real;86-real;89-real;90" CACHE STRING "CUDA architectures of the kernels (CMAKE_CUDA_ARCHITECTURES syntax)")
if(COLOSSUS_WITH_CUDA)
  # Torch's CMake appends its own -gencode flags (from TORCH_CUDA_ARCH_LIST) to
  # CMAKE_CUDA_FLAGS; our .cu files include no torch header, so the list above
  # alone decides what they are built for (else an "80-virtual" build would
  # still carry sm_90a machine code, measured with cuobjdump).
  string(REGEX REPLACE "-gencode[ ]+arch=[^ ]+" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
  set(CMAKE_CUDA_ARCHITECTURES ${COLOSSUS_CUDA_ARCHS})
  set(CMAKE_CUDA_STANDARD 17)
  enable_language(CUDA)
  # nccl.h comes from the nvidia-nccl wheel that torch depends on.
  find_path(NCCL_INCLUDE_DIR nccl.h
            HINTS ${COLOSSUS_TORCH_ROOT}/../nvidia/nccl/include ${COLOSSUS_TORCH_ROOT}/../nvidia/cu13/include
                  /usr/local/cuda/include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${COLOSSUS_TORCH_ROOT}/../nvidia/nccl/lib ${COLOSSUS_TORCH_ROOT}/../nvidia/cu13/lib
                     /usr/local/cuda/lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "CUDA build needs nccl.h and libnccl (from the nvidia-nccl wheel); found include='${NCCL_INCLUDE_DIR}' lib='${NCCL_LIBRARY}'")
  endif()
endif()
message(STATUS "Colossus: torch ${Torch_VERSION} at ${COLOSSUS_TORCH_ROOT}, CUDA parts: ${COLOSSUS_WITH_CUDA}, server (cpp-httplib): ${HTTPLIB_FOUND}")

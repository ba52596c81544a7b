# colossus_library(NAME SOURCES... [DEPS ...]): one library per layer folder,
# sharing one precompiled header and one set of warning flags.

# Designated initializers that leave fields at their defaults are the house
# style for options; GCC 13 would warn on each.
set(COLOSSUS_WARNINGS -Wall -Wextra -Wno-missing-field-initializers)
# GCC 13's -Wdangling-reference fires on every `const auto& c = f({...})`
# where f returns a reference to long-lived state (launch_from_env does).
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-Wno-dangling-reference COLOSSUS_HAS_DANGLING_REFERENCE_WARNING)
if(COLOSSUS_HAS_DANGLING_REFERENCE_WARNING)
  list(APPEND COLOSSUS_WARNINGS -Wno-dangling-reference)
endif()
if(COLOSSUS_WERROR)
  list(APPEND COLOSSUS_WARNINGS -Werror)
endif()

# The PCH host: every Colossus C++ target reuses its precompiled header, so all
# of them must share these compile options.
# What is ours alone (warnings, -Werror, code generation flags, toml++, the
# version macro) sits behind BUILD_INTERFACE: every target of this build gets
# it, while the installed package (cmake/install.cmake) exports only what a
# program that includes our headers needs: the include root, the definitions
# our headers depend on, and the libraries.
add_library(colossus_options INTERFACE)
target_include_directories(colossus_options INTERFACE $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}> $<INSTALL_INTERFACE:include>)
target_include_directories(colossus_options SYSTEM INTERFACE $<BUILD_INTERFACE:${TOMLPP_INCLUDE_DIR}>)
target_compile_options(colossus_options INTERFACE
  $<BUILD_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:${COLOSSUS_WARNINGS} -fPIC -fopenmp-simd>>)
target_compile_definitions(colossus_options INTERFACE $<BUILD_INTERFACE:COLOSSUS_VERSION="${PROJECT_VERSION}">)
# torch ships its own fmt (v12) headers ahead of Debian's on the include path, so
# fmt is used header-only from there rather than linked from Debian.
target_compile_definitions(colossus_options INTERFACE FMT_HEADER_ONLY OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
target_link_libraries(colossus_options INTERFACE torch_cpu c10 nlohmann_json::nlohmann_json Threads::Threads)
# The torch wheel's libtorch.so and libtorch_cpu.so export their own statically
# linked copies of libstdc++'s std::filesystem (strong symbols, from RHEL's
# libstdc++_nonshared.a). Linked ahead of the system libstdc++, they win the
# symbol lookup: a CUDA build's `colossus` (which links libtorch.so) called
# libtorch.so's std::filesystem::remove_all, which segfaults on a directory
# tree, the first time keep_last pruned a checkpoint (issue 20; reproduced on
# the CPU by linking libtorch.so first). libstdc++ first in every executable's
# DT_NEEDED makes each std:: symbol bind to the library our headers describe
# (tests/core/stdlib_binding_test.cpp checks it, linking libtorch.so).
target_link_options(colossus_options INTERFACE "SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")

add_library(colossus_pch OBJECT ${CMAKE_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(colossus_pch PUBLIC colossus_options)
target_precompile_headers(colossus_pch PRIVATE ${CMAKE_SOURCE_DIR}/colossus/pch.h)

function(colossus_use_pch target)
  target_precompile_headers(${target} REUSE_FROM colossus_pch)
endfunction()

function(colossus_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC colossus_options ${ARG_DEPS})
  colossus_use_pch(${name})
endfunction()

# colossus_test(NAME SOURCES... DEPS ... [RANKS n...]): a GoogleTest binary;
# with RANKS, CTest also runs it under mpirun once per rank count.
function(colossus_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;RANKS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE colossus_options colossus_testing ${ARG_DEPS} GTest::gtest)
  # In CUDA builds every test links the CUDA library and the full `torch`
  # target: torch_cuda registers the CUDA hooks only when it is loaded, and a
  # test whose own code names no CUDA symbol would otherwise see no device.
  if(COLOSSUS_WITH_CUDA)
    target_link_libraries(${name} PRIVATE colossus)
  endif()
  colossus_use_pch(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(ARG_RANKS)
    foreach(n IN LISTS ARG_RANKS)
      add_test(NAME ${name}_np${n}
               COMMAND ${CMAKE_SOURCE_DIR}/scripts/mpirun_test.sh ${n} $<TARGET_FILE:${name}>)
      set_tests_properties(${name}_np${n} PROPERTIES TIMEOUT ${ARG_TIMEOUT} PROCESSORS 2 LABELS "${ARG_LABELS};mpi")
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
  endif()
endfunction()

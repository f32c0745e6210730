# CMake toolchain for linux/arm64 with Debian's cross compiler
# (gcc-aarch64-linux-gnu); tests run under qemu-user (scripts/cross.sh).
# libasync itself is built by go: pass GOARCH/CC through ASYNC_GO, e.g.
#   -DASYNC_GO="/usr/bin/env;GOARCH=arm64;CC=aarch64-linux-gnu-gcc;go"
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
find_program(ASYNC_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(ASYNC_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ASYNC_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()

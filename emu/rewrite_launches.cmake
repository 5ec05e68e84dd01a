# emu/rewrite_launches.cmake — turns one kernels/*.cu into host C++ for the
# CUDA emulation: `k<<<grid, block[, smem[, stream]]>>>(args)` becomes
# DOL_EMU_LAUNCH(k, grid, block, ...)(args) (emu/cuda_emu.h), and
# `extern __shared__ T name[];` a pointer to the launch's dynamic shared
# memory. A #line directive keeps diagnostics pointing at the .cu file.
# Each `__launch_bounds__(N) kernel_name(` also gets a registration appended
# (dol_emu_register_bounds, emu/cuda_emu.h), so that the emulation checks
# every launch of that kernel against N.
# Usage: cmake -DIN=<file.cu> -DOUT=<file.cpp> -P emu/rewrite_launches.cmake
file(READ "${IN}" src)
set(bounds_re "__launch_bounds__[ \t]*\\(([^()]*)\\)[ \t\r\n]*([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*\\(")
string(REGEX MATCHALL "${bounds_re}" bounds_all "${src}")
string(REGEX MATCHALL "__launch_bounds__[ \t]*\\(" bounds_any "${src}")
list(LENGTH bounds_all n_bounds)
list(LENGTH bounds_any n_any)
if(NOT n_bounds EQUAL n_any)
  message(FATAL_ERROR "${IN}: a __launch_bounds__ the emulation cannot read (expected `__launch_bounds__(N) name(`)")
endif()
set(bounds_regs "")
set(i 0)
foreach(b ${bounds_all})
  string(REGEX MATCH "${bounds_re}" _ "${b}")
  string(APPEND bounds_regs "[[maybe_unused]] static const int dol_emu_bounds_${i}_ = dol_emu_register_bounds(\"${CMAKE_MATCH_2}\", DOL_EMU_BOUNDS_FIRST(${CMAKE_MATCH_1}));\n")
  math(EXPR i "${i} + 1")
endforeach()
string(REGEX REPLACE
  "([A-Za-z_][A-Za-z0-9_:]*(<[^<>;]*>)?)[ \t]*<<<([^>]*)>>>"
  "DOL_EMU_LAUNCH(\\1, \\3)" src "${src}")
string(REGEX REPLACE
  "extern[ \t]+__shared__[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\[[ \t]*\\][ \t]*;"
  "\\1 *const \\2 = static_cast<\\1 *>(dol_emu_dyn_smem());" src "${src}")
if(src MATCHES "<<<|>>>")
  message(FATAL_ERROR "${IN}: a kernel launch the emulation cannot rewrite")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}\n/* emu/rewrite_launches.cmake: the kernels' __launch_bounds__ */\n${bounds_regs}")
file(RENAME "${OUT}.tmp" "${OUT}")

// The CPU engine is compiled once per x86 instruction set (CMakeLists.txt: baseline x86-64,
// AVX2 + FMA, AVX-512), each copy inside its own inline namespace FUSEDATTN_CPU_ISA, so the copies
// share no symbol (not even an inline helper the linker could merge across them).
// src/cpu_dispatch.cc picks one copy per process at run time. Code built outside that scheme (the
// C++ unit tests) sees the baseline namespace.
#pragma once

#ifndef FUSEDATTN_CPU_ISA
#define FUSEDATTN_CPU_ISA base
#endif

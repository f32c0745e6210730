/* The classic headers as C++11: see header_classic.c. */
#include "header_classic.c"

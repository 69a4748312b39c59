// What RunGen's random:SEED:EXTENTS input holds (tools/RunGen.h, FillWithRandom, Halide 21): a
// std::mt19937(SEED) and, per element type, the distribution RunGen draws it from, in memory
// order. The reference for tests/test_rungen_random.py. Usage: rungen_random TYPE SEED COUNT
// (writes COUNT elements' bytes to stdout).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
template<typename T, typename D> void emit(D dis, std::mt19937 &rng, long n) {
    T *out = new T[n];
    for (long i = 0; i < n; i++) out[i] = static_cast<T>(dis(rng));
    fwrite(out, sizeof(T), n, stdout);
    delete[] out;
}
int main(int argc, char **argv) {
    const char *t = argv[1];
    std::mt19937 rng(atoi(argv[2]));
    long n = atol(argv[3]);
    if (!strcmp(t, "float32")) emit<float>(std::uniform_real_distribution<float>(0.0, 1.0), rng, n);
    else if (!strcmp(t, "float64")) emit<double>(std::uniform_real_distribution<double>(0.0, 1.0), rng, n);
    else if (!strcmp(t, "bool")) emit<bool>(std::uniform_int_distribution<int>(0, 1), rng, n);
    else if (!strcmp(t, "int8")) emit<int8_t>(std::uniform_int_distribution<int>(-128, 127), rng, n);
    else if (!strcmp(t, "uint8")) emit<uint8_t>(std::uniform_int_distribution<int>(0, 255), rng, n);
    else if (!strcmp(t, "int16")) emit<int16_t>(std::uniform_int_distribution<int16_t>(), rng, n);
    else if (!strcmp(t, "uint16")) emit<uint16_t>(std::uniform_int_distribution<uint16_t>(), rng, n);
    else if (!strcmp(t, "int32")) emit<int32_t>(std::uniform_int_distribution<int32_t>(), rng, n);
    else if (!strcmp(t, "uint32")) emit<uint32_t>(std::uniform_int_distribution<uint32_t>(), rng, n);
    else if (!strcmp(t, "int64")) emit<int64_t>(std::uniform_int_distribution<int64_t>(), rng, n);
    else if (!strcmp(t, "uint64")) emit<uint64_t>(std::uniform_int_distribution<uint64_t>(), rng, n);
    else return 2;
    return 0;
}

// The small consumer: gradus::cpu_simd alone (cpu_simd.cpp), for the packaging tests whose
// point is where gradus comes from (FetchContent, the .deb) rather than which parts link.
int check_cpu_simd();

int main() { return check_cpu_simd(); }

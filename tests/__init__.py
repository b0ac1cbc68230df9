# A subprocess a test starts is stopped after this long: a net for a hang, not a measure of speed (a
# pytest session of two workers took over 120 s on a 2-core machine at a load of 10).
SUBPROCESS_TIMEOUT_S = 900

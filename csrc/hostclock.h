/* The host's TSC rate.  Under TCG the guest's TSC is the host's, and telling
 * the guest its rate (tsc_early_khz=) spares it a calibration that, when the
 * host is busy, can fail and leave it waiting for timer ticks that an ACPI
 * microvm never sends.  Handed to cffi's cdef like relay.h. */
#ifndef PARACELL_HOSTCLOCK_H
#define PARACELL_HOSTCLOCK_H

/* TSC ticks per millisecond, measured against CLOCK_MONOTONIC_RAW over
 * sample_ms; 0 where the CPU has no usable TSC. */
unsigned long pc_tsc_khz(unsigned sample_ms);

#endif

/* clock.h — monotonic time in seconds, for durations (never wall-clock
 * dates: metrics' timestamps use time(2)/gettimeofday where they need one). */
#ifndef KVB_CLOCK_H
#define KVB_CLOCK_H

double kvb_clock_s(void); /* CLOCK_MONOTONIC, seconds */

#endif

"""Free-tier accounting: the kinds of free tier, rate-limit headers, backoff, windows and
credits."""

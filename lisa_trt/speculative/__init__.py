"""Speculative decoding: sampling math, draft trees, verification rules, decode loops."""

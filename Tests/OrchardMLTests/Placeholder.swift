// Tests for this module land with its issue; this file only keeps the target buildable until then.
import Testing

"""horizonrl cluster."""

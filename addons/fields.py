"""Header fields read in one pass over the raw byte pairs: etiquette_proxy/headers.py (this name
is kept for the addons that import it from here until they import it from the core)."""

from etiquette_proxy.headers import field_value, fields_named, has_field

__all__ = ["field_value", "fields_named", "has_field"]

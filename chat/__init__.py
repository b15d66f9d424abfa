"""Chat: roles and their disclosures, monitors, the pushback policy, the LLM gateway, conversations."""

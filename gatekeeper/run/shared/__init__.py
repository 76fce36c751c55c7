"""What every lane of a run shares: its settings, its journal opened, its input re-read, the parts' wiring, the
preparation, the summary and the export."""

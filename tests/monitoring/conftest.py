from __future__ import annotations

import pytest

from tests.monitoring.scrape import Scrape, scrape_live


@pytest.fixture(scope="session")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Scrape:
    """The live replica's /metrics, scraped once for every alert and dashboard test."""
    return scrape_live(tmp_path_factory.mktemp("scrape"))

#include "driver/optimizer_from_deck.h"

namespace tandem {

OptimizerSettings optimizer_settings_from_deck(const Deck& deck) {
  OptimizerSettings settings;
  settings.kind = optimizer_kind_from_name(deck.get<std::string>("optimizer.name"));
  const auto [beta1, beta2] = parse_betas(deck.get<std::string>("optimizer.betas"));  // checked by the deck's rules
  settings.adamw = AdamWSettings{.lr = 0,
                                 .beta1 = beta1,
                                 .beta2 = beta2,
                                 .eps = deck.get<double>("optimizer.eps"),
                                 .weight_decay = deck.get<double>("optimizer.weight-decay")};
  settings.momentum = deck.get<double>("optimizer.momentum");
  return settings;
}

}  // namespace tandem

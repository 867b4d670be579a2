mod catalog;
mod fuzz;
mod layers;
mod query;
mod rules;
mod store;
mod take;
